// What spindle's tools read about a process (<spindle/diagnostics.hpp>): its
// limits and command line, sysctls, its maps, a thread's stack pointer and the
// memory there (spindle doctor, limit_threads' thread attribution, spindle
// bench). Converts types and releases the GIL; the reading is diagnostics'.
#include <pybind11/stl.h>

#include <spindle/diagnostics.hpp>

#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {

void register_diagnostics(py::module_& m) {
  namespace dx = diagnostics;
  const auto root = py::arg("proc_root") = dx::kProcRoot;  // every reader's last, keyword-only argument
  m.def("process_limits", [](int pid, const std::string& r) {
    return or_none(without_gil([&] { return dx::read_limits(pid, r); }), [](const auto& limits) {
      py::dict out;
      for (const auto& l : limits) out[py::str(l.name)] = py::make_tuple(l.soft, l.hard);
      return out;
    });
  }, py::arg("pid"), py::kw_only(), root,
  "/proc/<pid>/limits as {name: (soft, hard)}, e.g. \"Max processes\"; None for unlimited. None if the process is gone.");
  m.def("process_cmdline", [](int pid, const std::string& r) { return without_gil([&] { return dx::read_cmdline(pid, r); }); },
        py::arg("pid"), py::kw_only(), root,
        "/proc/<pid>/cmdline as its arguments (empty for a kernel thread); None if the process is gone.");
  m.def("sysctl_int", [](const std::string& name, const std::string& r) {
    return without_gil([&] { return dx::read_sysctl_int(name, r); });
  }, py::arg("name"), py::kw_only(), root,
  "An integer sysctl named as sysctl(8) names it (\"kernel.threads-max\"); None if absent or unreadable.");
  m.def("process_maps", [](int pid, const std::string& r) {
    return or_none(without_gil([&] { return dx::read_maps(pid, r); }), [](const auto& maps) {
      py::list out;
      for (const auto& mp : maps) out.append(py::make_tuple(mp.start, mp.end, mp.perms, mp.path));
      return out;
    });
  }, py::arg("pid"), py::kw_only(), root,
  "/proc/<pid>/maps as (start, end, perms, path) tuples, path \"\" for anonymous memory; None if the "
  "process is gone. OSError without ptrace access.");
  m.def("thread_stack_pointer", [](int pid, int tid, const std::string& r) {
    return or_none(without_gil([&] { return dx::read_thread_syscall(pid, tid, r); }), [](const auto& state) {
      return state.running ? py::object(py::str("running")) : py::object(py::int_(*state.stack_pointer));
    });
  }, py::arg("pid"), py::arg("tid"), py::kw_only(), root,
  "The stack pointer of a blocked thread (/proc/<pid>/task/<tid>/syscall), \"running\" for a thread on a "
  "CPU, None if it is gone. OSError without ptrace access.");
  m.def("read_process_memory", [](int pid, uint64_t address, std::size_t length, const std::string& r) {
    return or_none(without_gil([&] { return dx::read_memory(pid, address, length, r); }),
                   [](const std::string& data) { return py::bytes(data); });
  }, py::arg("pid"), py::arg("address"), py::arg("length"), py::kw_only(), root,
  "length bytes of process pid's memory at address (/proc/<pid>/mem; fewer where the range ends in "
  "unmapped memory); None if the process is gone. OSError without ptrace access.");
}

}  // namespace spindle::python
