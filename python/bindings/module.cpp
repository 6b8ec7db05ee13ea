// The spindle._core extension: only calls the per-area registration functions.
#include <pybind11/pybind11.h>

#include "register.hpp"

PYBIND11_MODULE(_core, m) {
  m.doc() = "spindle's C++ runtime (private; use the spindle package).";
  spindle::python::register_errors(m);
  spindle::python::register_budget(m);
  spindle::python::register_layout(m);
  spindle::python::register_worker(m);
  spindle::python::register_loader(m);
  spindle::python::register_sources(m);
  spindle::python::register_ops(m);
  spindle::python::register_pipeline(m);
  spindle::python::register_procfs(m);
  spindle::python::register_diagnostics(m);
  spindle::python::register_shared(m);
}
