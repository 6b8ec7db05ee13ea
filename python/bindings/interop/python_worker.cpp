#include "python_worker.hpp"

#include <Python.h>

#include <stdexcept>
#include <utility>

#include "fork_protocol.hpp"

namespace py = pybind11;

namespace spindle::python {

int system_exit_code(const py::object& exc) {
  try {
    py::object code = exc.attr("code");
    if (code.is_none()) return 0;
    if (py::isinstance<py::int_>(code)) return code.cast<int>();
    py::print(code, py::arg("file") = py::module_::import("sys").attr("stderr"));
  } catch (py::error_already_set&) {
    PyErr_Clear();
  }
  return 1;
}

WorkerMain python_worker_main(py::function fn) {
  return [fn = std::move(fn)](WorkerContext& ctx) -> int {
    // Runs in the forked child, which holds the GIL: fork happened while
    // the constructing thread held it.
    try {
      py::object rc = fn(py::cast(&ctx, py::return_value_policy::reference));
      return rc.is_none() ? 0 : rc.cast<int>();
    } catch (py::error_already_set& e) {
      // sys.exit() in dataset code: the worker exits with its code, as a
      // multiprocessing child does. Not through PyErr_Print, which would call
      // Py_Exit and finalize the interpreter in a forked child (the consumer's
      // objects and atexit handlers run there; a Loader inherited from the
      // consumer crashed in its destructor).
      if (e.matches(PyExc_SystemExit)) return system_exit_code(e.value());
      e.restore();
      PyErr_Print();
      return 1;
    }
  };
}

Launcher python_launcher(std::optional<py::function> worker_main, std::optional<std::vector<std::string>> spawn_argv,
                         std::vector<int> spawn_fds, std::vector<std::string> spawn_env) {
  if (spawn_argv) return Launcher::spawn(SpawnSpec{*spawn_argv, std::move(spawn_fds), std::move(spawn_env)});
  if (!worker_main) throw py::value_error("spindle: a Loader needs worker_main (forked workers) or spawn_argv");
  return Launcher::fork(python_worker_main(std::move(*worker_main)), interpreter_fork_hooks());
}

}  // namespace spindle::python
