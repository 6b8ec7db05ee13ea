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
  m.def(
      "process_limits",
      [](int pid, const std::string& proc_root) {
        const auto limits = without_gil([&] { return diagnostics::read_limits(pid, proc_root); });
        if (!limits) return py::object(py::none());
        py::dict out;
        for (const auto& l : *limits) out[py::str(l.name)] = py::make_tuple(l.soft, l.hard);
        return py::object(std::move(out));
      },
      py::arg("pid"), py::kw_only(), py::arg("proc_root") = diagnostics::kProcRoot,
      "/proc/<pid>/limits as {name: (soft, hard)}, e.g. \"Max processes\"; None for unlimited. None if the "
      "process is gone.");
  m.def(
      "process_cmdline",
      [](int pid, const std::string& proc_root) {
        return without_gil([&] { return diagnostics::read_cmdline(pid, proc_root); });
      },
      py::arg("pid"), py::kw_only(), py::arg("proc_root") = diagnostics::kProcRoot,
      "/proc/<pid>/cmdline as its arguments (empty for a kernel thread); None if the process is gone.");
  m.def(
      "sysctl_int",
      [](const std::string& name, const std::string& proc_root) {
        return without_gil([&] { return diagnostics::read_sysctl_int(name, proc_root); });
      },
      py::arg("name"), py::kw_only(), py::arg("proc_root") = diagnostics::kProcRoot,
      "An integer sysctl named as sysctl(8) names it (\"kernel.threads-max\"); None if absent or unreadable.");
  m.def(
      "process_maps",
      [](int pid, const std::string& proc_root) {
        const auto maps = without_gil([&] { return diagnostics::read_maps(pid, proc_root); });
        if (!maps) return py::object(py::none());
        py::list out;
        for (const auto& mp : *maps) out.append(py::make_tuple(mp.start, mp.end, mp.perms, mp.path));
        return py::object(std::move(out));
      },
      py::arg("pid"), py::kw_only(), py::arg("proc_root") = diagnostics::kProcRoot,
      "/proc/<pid>/maps as (start, end, perms, path) tuples, path \"\" for anonymous memory; None if the "
      "process is gone. OSError without ptrace access.");
  m.def(
      "thread_stack_pointer",
      [](int pid, int tid, const std::string& proc_root) -> py::object {
        const auto state = without_gil([&] { return diagnostics::read_thread_syscall(pid, tid, proc_root); });
        if (!state) return py::none();
        if (state->running) return py::str("running");
        return py::int_(*state->stack_pointer);
      },
      py::arg("pid"), py::arg("tid"), py::kw_only(), py::arg("proc_root") = diagnostics::kProcRoot,
      "The stack pointer of a blocked thread (/proc/<pid>/task/<tid>/syscall), \"running\" for a thread on a "
      "CPU, None if it is gone. OSError without ptrace access.");
  m.def(
      "read_process_memory",
      [](int pid, uint64_t address, std::size_t length, const std::string& proc_root) -> py::object {
        const auto data = without_gil([&] { return diagnostics::read_memory(pid, address, length, proc_root); });
        if (!data) return py::none();
        return py::bytes(*data);
      },
      py::arg("pid"), py::arg("address"), py::arg("length"), py::kw_only(), py::arg("proc_root") = diagnostics::kProcRoot,
      "length bytes of process pid's memory at address (/proc/<pid>/mem; fewer where the range ends in "
      "unmapped memory); None if the process is gone. OSError without ptrace access.");
}

}  // namespace spindle::python
