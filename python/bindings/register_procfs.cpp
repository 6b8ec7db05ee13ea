// The operating-system facts of <spindle/procfs.hpp>: a process's stat, its
// threads and their names, the cgroup pids levels, another process's
// descriptor, parent death. Converts types and releases the GIL; the reading
// is all procfs's. The tools' readers are register_diagnostics.cpp's.
#include <pybind11/stl.h>

#include <spindle/procfs.hpp>

#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {
void register_procfs(py::module_& m) {
  py::class_<procfs::ProcessStat>(m, "ProcessStat", "The fields of /proc/<pid>/stat the package uses.")
      .def_readonly("pid", &procfs::ProcessStat::pid, "The process id (field 1).")
      .def_readonly("comm", &procfs::ProcessStat::comm, "Its name (field 2), without the parentheses.")
      .def_property_readonly("state", [](const procfs::ProcessStat& s) { return std::string(1, s.state); },
                             "The state letter (field 3): R, S, D, T, t, Z, X, ...")
      .def_readonly("ppid", &procfs::ProcessStat::ppid, "The parent's pid (field 4).")
      .def_readonly("num_threads", &procfs::ProcessStat::num_threads, "Its threads (field 20).")
      .def_readonly("utime", &procfs::ProcessStat::utime, "Clock ticks of CPU time in user mode (field 14).")
      .def_readonly("stime", &procfs::ProcessStat::stime, "Clock ticks of CPU time in the kernel (field 15).")
      .def_readonly("start_time", &procfs::ProcessStat::start_time,
                    "Clock ticks after boot when it started (field 22); tells a reused pid apart.")
      .def("__repr__", [](const procfs::ProcessStat& s) {
        return "ProcessStat(pid=" + std::to_string(s.pid) + ", comm='" + s.comm + "', state='" + s.state +
               "', ppid=" + std::to_string(s.ppid) + ", num_threads=" + std::to_string(s.num_threads) +
               ", start_time=" + std::to_string(s.start_time) + ")";
      });

  py::class_<procfs::ProcessStatus>(m, "ProcessStatus", "The fields of /proc/<pid>/status the package uses.")
      .def_readonly("name", &procfs::ProcessStatus::name, "Name:")
      .def_readonly("ppid", &procfs::ProcessStatus::ppid, "PPid:")
      .def_readonly("real_uid", &procfs::ProcessStatus::real_uid, "The first of Uid: (the real uid).")
      .def_readonly("threads", &procfs::ProcessStatus::threads, "Threads:")
      .def("__repr__", [](const procfs::ProcessStatus& s) {
        return "ProcessStatus(name='" + s.name + "', ppid=" + std::to_string(s.ppid) +
               ", real_uid=" + std::to_string(s.real_uid) + ", threads=" + std::to_string(s.threads) + ")";
      });

  m.def(
      "process_status",
      [](int pid, const std::string& proc_root) {
        py::gil_scoped_release release;
        return procfs::read_status(pid, proc_root);
      },
      py::arg("pid"), py::kw_only(), py::arg("proc_root") = procfs::kProcRoot,
      "/proc/<pid>/status parsed; None if the process is gone. OSError if it cannot be read.");
  py::class_<procfs::MemoryRollup>(m, "MemoryRollup",
                                   "A process's memory from /proc/<pid>/smaps_rollup, in bytes.")
      .def_readonly("rss", &procfs::MemoryRollup::rss, "Resident pages, shared ones counted whole.")
      .def_readonly("pss", &procfs::MemoryRollup::pss, "Resident pages, each shared one split among its mappers.")
      .def_readonly("uss", &procfs::MemoryRollup::uss,
                    "Private pages (Private_Clean + Private_Dirty): what this process alone pays.")
      .def_readonly("swap", &procfs::MemoryRollup::swap, "Swapped-out pages.")
      .def("__repr__", [](const procfs::MemoryRollup& r) {
        return "MemoryRollup(rss=" + std::to_string(r.rss) + ", pss=" + std::to_string(r.pss) +
               ", uss=" + std::to_string(r.uss) + ", swap=" + std::to_string(r.swap) + ")";
      });
  m.def(
      "process_memory",
      [](int pid, const std::string& proc_root) {
        py::gil_scoped_release release;
        return procfs::read_memory(pid, proc_root);
      },
      py::arg("pid"), py::kw_only(), py::arg("proc_root") = procfs::kProcRoot,
      "/proc/<pid>/smaps_rollup parsed (rss, pss, uss, swap in bytes); None if the process is gone or has "
      "released its memory. OSError if it cannot be read.");
  m.def(
      "process_ids",
      [](const std::string& proc_root) {
        py::gil_scoped_release release;
        return procfs::process_ids(proc_root);
      },
      py::kw_only(), py::arg("proc_root") = procfs::kProcRoot,
      "The pids listed in /proc (every process, kernel threads included), ascending.");
  m.def(
      "process_stat",
      [](int pid, const std::string& proc_root) {
        py::gil_scoped_release release;
        return procfs::read_stat(pid, proc_root);
      },
      py::arg("pid"), py::kw_only(), py::arg("proc_root") = procfs::kProcRoot,
      "/proc/<pid>/stat parsed (comm may hold spaces and ')'); None if the process is gone. "
      "OSError if it cannot be read.");
  m.def(
      "process_threads",
      [](int pid, const std::string& proc_root) {
        std::optional<std::vector<procfs::ThreadEntry>> found;
        {
          py::gil_scoped_release release;
          found = procfs::threads(pid, proc_root);
        }
        if (!found) return std::optional<std::vector<std::pair<int, std::string>>>();
        std::vector<std::pair<int, std::string>> out;
        out.reserve(found->size());
        for (auto& t : *found) out.emplace_back(t.tid, std::move(t.name));
        return std::optional(std::move(out));
      },
      py::arg("pid"), py::kw_only(), py::arg("proc_root") = procfs::kProcRoot,
      "(tid, name) of every thread of process pid, ascending by tid, the name from its comm; None if the "
      "process is gone. Threads that exit while it looks are left out.");
  m.def(
      "count_process_threads",
      [](int pid) {
        py::gil_scoped_release release;
        auto tids = procfs::thread_ids(pid);
        return tids ? static_cast<int>(tids->size()) : 0;
      },
      py::arg("pid"), "Threads of process pid (entries of /proc/<pid>/task); 0 if it does not exist.");
  m.def(
      "cgroup_pids_levels",
      [](std::optional<int> pid, const std::string& proc_root, const std::string& cgroup_root) {
        std::vector<procfs::PidsLevel> levels;
        {
          py::gil_scoped_release release;
          levels = procfs::cgroup_pids_levels(pid, proc_root, cgroup_root);
        }
        py::list out;
        for (const auto& lv : levels) {
          py::dict d;
          d["path"] = lv.path;
          d["max"] = lv.max;
          d["current"] = lv.current;
          out.append(std::move(d));
        }
        return out;
      },
      py::arg("pid") = py::none(), py::kw_only(), py::arg("proc_root") = procfs::kProcRoot,
      py::arg("cgroup_root") = procfs::kCgroupRoot,
      "pids.max and pids.current of every level from the cgroup of pid (None: this process) up to the "
      "root (v2, or the v1 pids hierarchy, which wins), as dicts with path, max (None: no limit) and "
      "current; levels without both files are left out. ThreadBudget binds to the tightest of them.");
  m.def("clock_ticks_per_second", &procfs::clock_ticks_per_second,
        "Clock ticks per second: the unit of ProcessStat.utime, stime and start_time.");
  m.def(
      "open_process_fd",
      [](int pid, int fd, const std::string& proc_root) {
        return without_gil([&] { return procfs::open_process_fd(pid, fd, proc_root); });
      },
      py::arg("pid"), py::arg("fd"), py::kw_only(), py::arg("proc_root") = procfs::kProcRoot,
      "Process pid's descriptor fd opened anew, read-only (/proc/<pid>/fd/<fd>); the new descriptor is the "
      "caller's to close. OSError (errno set) if the process or descriptor is gone or another uid's.");
  m.def(
      "arm_parent_death",
      [](int parent, int signal) {
        py::gil_scoped_release release;
        return procfs::arm_parent_death(parent, signal);
      },
      py::arg("parent"), py::arg("signal"),
      "In a child of parent: asks for signal when the parent dies (PR_SET_PDEATHSIG), then checks it "
      "had not died already. False if it had (exit then). OSError if prctl refuses the signal.");
}

}  // namespace spindle::python
