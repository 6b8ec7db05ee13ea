// ThreadBudget and thread counting.
#include <pybind11/stl.h>

#include <spindle/arena.hpp>
#include <spindle/thread_budget.hpp>

#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {
namespace {
// kUnlimited shows up in Python as None.
std::optional<int64_t> opt(int64_t v) { return v == kUnlimited ? std::nullopt : std::optional<int64_t>(v); }
}  // namespace

void register_budget(py::module_& m) {
  py::class_<ThreadPlan>(m, "ThreadPlan")
      .def_readonly("num_workers", &ThreadPlan::num_workers)
      .def_readonly("arena_threads", &ThreadPlan::arena_threads)
      .def_property_readonly("budget", [](const ThreadPlan& p) { return opt(p.budget); });

  py::class_<ThreadBudget>(m, "ThreadBudget")
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
      .def_property_readonly("nproc_limit", [](const ThreadBudget& b) { return opt(b.nproc_limit()); })
      .def_property_readonly("nproc_exempt", &ThreadBudget::nproc_exempt)
      .def_property_readonly("uid_tasks", &ThreadBudget::uid_tasks)
      .def_property_readonly("nproc_headroom", [](const ThreadBudget& b) { return opt(b.nproc_headroom()); })
      .def_property_readonly("cgroup_limit", [](const ThreadBudget& b) { return opt(b.cgroup_limit()); })
      .def_property_readonly("cgroup_current", &ThreadBudget::cgroup_current)
      .def_property_readonly("cgroup_headroom", [](const ThreadBudget& b) { return opt(b.cgroup_headroom()); })
      .def_property_readonly("cpus", &ThreadBudget::cpus)
      .def_property_readonly("user_cap", [](const ThreadBudget& b) { return opt(b.user_cap()); })
      .def_property_readonly("budget", [](const ThreadBudget& b) { return opt(b.budget()); })
      .def("plan", &ThreadBudget::plan, py::arg("num_workers"))
      .def("__repr__", [](const ThreadBudget& b) { return "ThreadBudget(" + b.describe() + ")"; });

  m.def("count_process_threads", [](int pid) { return count_process_threads(pid); }, py::arg("pid"));
  m.def("arena_extra_threads", [] { return Arena::global().extra_threads(); });
}

}  // namespace spindle::python
