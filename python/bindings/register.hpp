#pragma once
#include <pybind11/pybind11.h>

namespace spindle::python {
void register_errors(pybind11::module_& m);
void register_budget(pybind11::module_& m);
void register_loader(pybind11::module_& m);
void register_sources(pybind11::module_& m);
void register_ops(pybind11::module_& m);
}  // namespace spindle::python
