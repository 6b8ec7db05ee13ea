#pragma once
#include <pybind11/pybind11.h>

#include <chrono>
#include <functional>

#include <spindle/launcher.hpp>

namespace spindle::python {
// The interpreter's fork protocol, for every fork made from Python.
ForkHooks interpreter_fork_hooks();
// Seconds from Python (0 or inf: forever; NaN or negative: ValueError).
std::chrono::milliseconds timeout_ms(double timeout);
// Paces the ledger's "wait" policy: sleeps a poll period without the GIL
// (another thread may be the one giving a lease back) and raises on Ctrl-C.
std::function<void()> budget_poll();

void register_errors(pybind11::module_& m);
void register_budget(pybind11::module_& m);
void register_loader(pybind11::module_& m);
void register_sources(pybind11::module_& m);
void register_ops(pybind11::module_& m);
void register_pipeline(pybind11::module_& m);
void register_procfs(pybind11::module_& m);
}  // namespace spindle::python
