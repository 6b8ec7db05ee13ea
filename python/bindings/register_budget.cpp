// ThreadBudget and the budget ledger's leases.
#include <pybind11/stl.h>

#include <thread>

#include <spindle/budget_ledger.hpp>
#include <spindle/thread_budget.hpp>

#include "interop/convert.hpp"
#include "interop/fork_protocol.hpp"
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
      .def("plan", &ThreadBudget::plan, py::arg("num_workers"), py::arg("pending") = 0, py::arg("arena_held") = 0,
           "Plan for num_workers workers out of the budget less `pending` tasks leased elsewhere and not "
           "started yet, with arena threads within cpus - 1 less `arena_held` (those the process's live loaders "
           "hold); raises ThreadBudgetError, with the numbers, if they do not fit.")
      .def("__repr__", [](const ThreadBudget& b) { return "ThreadBudget(" + b.describe() + ")"; });

  py::tuple names(kBudgetPolicyNames.size());
  for (std::size_t i = 0; i < kBudgetPolicyNames.size(); ++i) names[i] = py::str(kBudgetPolicyNames[i]);
  m.attr("BUDGET_POLICIES") = names;
  m.def(
      "resolve_budget_policy",
      [](std::optional<std::string> name) { return std::string(budget_policy_name(resolve_budget_policy(name))); },
      py::arg("name") = py::none(),
      "The budget policy a loader runs with: name if given, else $SPINDLE_BUDGET_POLICY, else \"shrink\"; "
      "ValueError naming where a bad name came from. The one resolution of the policy; every front end asks here.");

  py::class_<LedgerLease>(m, "LedgerLease",
                          "A share of the node's thread budget (the budget ledger); given back by release() "
                          "or when garbage-collected. A forked child's copy gives nothing back.")
      .def_property_readonly("held", &LedgerLease::held)
      .def_property_readonly("id", &LedgerLease::id)
      .def("started", &LedgerLease::started, py::arg("n"), py::call_guard<py::gil_scoped_release>(),
           "n of the leased tasks now exist (so /proc counts them).")
      .def("release", &LedgerLease::reset, py::call_guard<py::gil_scoped_release>(), "Gives the share back now.");

  m.def(
      "reserve_stopping",
      [](int64_t tasks) {
        py::gil_scoped_release release;
        return BudgetLedger::global().reserve_stopping(tasks);
      },
      py::arg("tasks"),
      "A lease of `tasks` threads of this process that run now and are about to be stopped and restarted "
      "(numpy's OpenBLAS pool around spindle's forks): pending until released, so no loader takes their tasks "
      "meanwhile. Granted without a check.");
  m.def(
      "ledger_available",
      [](const LedgerLease& excluding) {
        int64_t n;
        {
          py::gil_scoped_release release;
          n = BudgetLedger::global().available(excluding);
        }
        return opt(n);
      },
      py::arg("excluding"),
      "Tasks free now for the threads `excluding` holds: the live budget less every other live lease's pending "
      "tasks (None: unlimited).");
  m.def(
      "lease_tasks",
      [](int tasks, const std::string& budget_policy, double timeout) {
        const BudgetPolicy policy = parse_budget_policy(budget_policy);
        const auto ms = timeout_ms(timeout);
        auto poll = budget_poll();
        // The cap keeps the plan at `tasks`: no arena threads come with them.
        BudgetSources sources;
        sources.user_cap = tasks;
        return BudgetLedger::global().acquire(tasks, policy, ms, [&] { return ThreadBudget(sources); }, poll).lease;
      },
      py::arg("tasks"), py::arg("budget_policy") = "wait", py::arg("timeout") = 10.0,
      "A lease of `tasks` tasks (a helper process spindle forks) from the node's budget, under `budget_policy` "
      "(\"shrink\" is not meaningful here and acts as \"fail\" once nothing is free); raises ThreadBudgetError "
      "with the numbers when they do not fit. Mark them started() once they exist.");
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
  m.def("arena_extra_threads", &arena_extra_threads,
        "Extra threads the process's TBB arena may run: the sum granted to the live loaders, at most cpus - 1.");
}

}  // namespace spindle::python
