#pragma once
// One register_<area> function per area of the _core module, each in its own
// register_<area>.cpp; module.cpp only calls them. What the bindings share
// beyond type conversion lives under interop/.
#include <pybind11/pybind11.h>

#include <optional>

namespace spindle::python {

// fn() with the GIL released: the reading is the core's, the conversion the caller's.
template <class Fn>
auto without_gil(Fn&& fn) {
  pybind11::gil_scoped_release release;
  return fn();
}

// `found` converted by `to` (with the GIL held), None when it is nullopt (the process or thread is gone).
template <class T, class To>
pybind11::object or_none(const std::optional<T>& found, To&& to) {
  return found ? pybind11::object(to(*found)) : pybind11::object(pybind11::none());
}

void register_errors(pybind11::module_& m);
void register_budget(pybind11::module_& m);
// SlotLayout, SampleRows, gather_rows, MIN_SLOT_BYTES.
void register_layout(pybind11::module_& m);
// WorkItem, WorkerExit, WorkerContext, AttachedWorker (the worker side).
void register_worker(pybind11::module_& m);
// LoaderOptions, Loader, Batch, CloseOnDrop (the consumer side).
void register_loader(pybind11::module_& m);
void register_sources(pybind11::module_& m);
void register_ops(pybind11::module_& m);
void register_pipeline(pybind11::module_& m);
// The runtime's operating-system facts (procfs.hpp).
void register_procfs(pybind11::module_& m);
// The tools' readers (diagnostics.hpp): limits, cmdline, sysctls, maps, stacks.
void register_diagnostics(pybind11::module_& m);
// SharedSegment, SegmentView (spindle.shared's storage).
void register_shared(pybind11::module_& m);
}  // namespace spindle::python
