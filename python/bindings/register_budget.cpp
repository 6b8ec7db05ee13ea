// ThreadBudget and thread counting.
#include <pybind11/stl.h>

#include <spindle/arena.hpp>
#include <spindle/budget_ledger.hpp>
#include <spindle/thread_budget.hpp>

#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {
namespace {
// kUnlimited shows up in Python as None.
std::optional<int64_t> opt(int64_t v) { return v == kUnlimited ? std::nullopt : std::optional<int64_t>(v); }
}  // namespace

void register_budget(py::module_& m) {
  py::class_<ThreadPlan>(m, "ThreadPlan", "What a loader may start: worker processes and extra arena threads.")
      .def_readonly("num_workers", &ThreadPlan::num_workers, "Worker processes, one thread each.")
      .def_readonly("arena_threads", &ThreadPlan::arena_threads, "Extra TBB threads the consumer may run (0: only the calling thread).")
      .def_property_readonly("budget", [](const ThreadPlan& p) { return opt(p.budget); }, "The budget the plan was cut from (None: unlimited).");

  py::class_<ThreadBudget>(m, "ThreadBudget",
                            "How many tasks (threads or processes) a loader may add, from RLIMIT_NPROC, the "
                            "tasks this uid already runs, the cgroup's pids.max and an optional cap. Limits that "
                            "do not apply read as None.")
      .def(py::init([](std::optional<int64_t> max_threads, std::string proc_root, std::string cgroup_root,
                       std::optional<uint32_t> uid, std::optional<int64_t> nproc_limit,
                       std::optional<bool> nproc_exempt, std::optional<int> cpus) {
             BudgetSources s;
             s.proc_root = std::move(proc_root);
             s.cgroup_root = std::move(cgroup_root);
             s.uid = uid;
             s.nproc_limit = nproc_limit;
             s.nproc_exempt = nproc_exempt;
             s.cpus = cpus;
             s.user_cap = max_threads;
             return ThreadBudget(s);
           }),
           py::kw_only(), py::arg("max_threads") = py::none(), py::arg("proc_root") = "/proc",
           py::arg("cgroup_root") = "/sys/fs/cgroup", py::arg("uid") = py::none(),
           py::arg("nproc_limit") = py::none(), py::arg("nproc_exempt") = py::none(),
           py::arg("cpus") = py::none())
      .def_property_readonly("nproc_limit", [](const ThreadBudget& b) { return opt(b.nproc_limit()); }, "RLIMIT_NPROC soft limit (ulimit -u).")
      .def_property_readonly("nproc_exempt", &ThreadBudget::nproc_exempt, "True for root, which the kernel exempts from RLIMIT_NPROC.")
      .def_property_readonly("uid_tasks", &ThreadBudget::uid_tasks, "Threads of all processes of this real uid, from /proc.")
      .def_property_readonly("nproc_headroom", [](const ThreadBudget& b) { return opt(b.nproc_headroom()); }, "nproc_limit - uid_tasks.")
      .def_property_readonly("cgroup_limit", [](const ThreadBudget& b) { return opt(b.cgroup_limit()); }, "pids.max of the binding cgroup level.")
      .def_property_readonly("cgroup_current", &ThreadBudget::cgroup_current, "pids.current of the binding cgroup level.")
      .def_property_readonly("cgroup_headroom", [](const ThreadBudget& b) { return opt(b.cgroup_headroom()); }, "Smallest pids.max - pids.current over our cgroup and its ancestors.")
      .def_property_readonly("cpus", &ThreadBudget::cpus, "CPUs this process may run on (affinity, cgroup cpu.max).")
      .def_property_readonly("user_cap", [](const ThreadBudget& b) { return opt(b.user_cap()); }, "The max_threads cap.")
      .def_property_readonly("budget", [](const ThreadBudget& b) { return opt(b.budget()); }, "min(nproc_headroom, cgroup_headroom, user_cap).")
      .def("plan", &ThreadBudget::plan, py::arg("num_workers"), py::arg("pending") = 0,
           "Plan for num_workers workers out of the budget less `pending` tasks leased elsewhere and not "
           "started yet; raises ThreadBudgetError, with the numbers, if they do not fit.")
      .def("__repr__", [](const ThreadBudget& b) { return "ThreadBudget(" + b.describe() + ")"; });

  m.def(
      "ledger_leases",
      [] {
        std::vector<py::dict> out;
        std::vector<LeaseInfo> leases;
        {
          py::gil_scoped_release release;
          leases = BudgetLedger::global().leases();
        }
        for (const auto& l : leases) {
          py::dict d;
          d["pid"] = l.pid;
          d["start_time"] = l.start_time;
          d["lease_id"] = l.lease_id;
          d["tasks"] = l.tasks;
          d["pending"] = l.pending;
          d["alive"] = l.alive;
          out.push_back(std::move(d));
        }
        return out;
      },
      "The node budget ledger's leases as found (pid, start_time, lease_id, tasks, pending, alive), "
      "or this process's own if the shared table is not used.");
  m.def(
      "ledger_status",
      [] {
        LedgerStatus s;
        {
          py::gil_scoped_release release;
          s = BudgetLedger::global().status();
        }
        py::dict d;
        d["path"] = s.path;
        d["usable"] = s.usable;
        d["warning"] = s.warning;
        return d;
      },
      "Where the node budget ledger is and whether it is used (with the reason if not).");
  m.def("count_process_threads", [](int pid) { return count_process_threads(pid); }, py::arg("pid"),
        "Threads of process pid (entries of /proc/<pid>/task); 0 if it does not exist.");
  m.def("arena_extra_threads", [] { return Arena::global().extra_threads(); },
        "Extra threads the process's TBB arena may run: the sum granted to the live loaders, at most cpus - 1.");
}

}  // namespace spindle::python
