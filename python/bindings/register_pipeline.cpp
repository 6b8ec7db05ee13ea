// Native pipelines: PipelineOptions (bound as an option struct), Pipeline, and
// the runtime Loader that runs one in forked workers or on arena threads.
#include <pybind11/stl.h>

#include <spindle/loader.hpp>
#include <spindle/pipeline.hpp>

#include "interop/convert.hpp"
#include "interop/fork_protocol.hpp"
#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {

void register_pipeline(py::module_& m) {
  py::class_<PipelineOptions::RandomResizedCrop>(m, "RandomResizedCrop")
      .def(py::init<>())
      .def_readwrite("size", &PipelineOptions::RandomResizedCrop::size)
      .def_readwrite("scale", &PipelineOptions::RandomResizedCrop::scale)
      .def_readwrite("ratio", &PipelineOptions::RandomResizedCrop::ratio);

  py::enum_<PipelineOptions::OnError>(m, "OnError")
      .value("RAISE", PipelineOptions::OnError::kRaise)
      .value("SKIP", PipelineOptions::OnError::kSkip);

  py::class_<PipelineOptions>(m, "PipelineOptions", "What a native pipeline reads and does (see pipeline.hpp).")
      .def(py::init<>())
      .def_readwrite("image_folder", &PipelineOptions::image_folder)
      .def_readwrite("npy", &PipelineOptions::npy)
      .def_readwrite("webdataset", &PipelineOptions::webdataset)
      .def_readwrite("webdataset_options", &PipelineOptions::webdataset_options)
      .def_readwrite("decode", &PipelineOptions::decode)
      .def_readwrite("random_resized_crop", &PipelineOptions::random_resized_crop)
      .def_readwrite("resize_shorter", &PipelineOptions::resize_shorter)
      .def_readwrite("center_crop", &PipelineOptions::center_crop)
      .def_readwrite("flip_probability", &PipelineOptions::flip_probability)
      .def_readwrite("normalize", &PipelineOptions::normalize)
      .def_readwrite("chw", &PipelineOptions::chw)
      .def_readwrite("on_error", &PipelineOptions::on_error)
      .def_readwrite("max_skip_ratio", &PipelineOptions::max_skip_ratio);

  py::class_<Pipeline, std::shared_ptr<Pipeline>>(m, "Pipeline")
      .def(py::init([](const PipelineOptions& o) { return std::make_shared<Pipeline>(o); }), py::arg("options"))
      .def("__len__", &Pipeline::size)
      .def_property_readonly("streaming", &Pipeline::streaming)
      .def("fields",
           [](const Pipeline& p) {
             const SlotLayout l = p.layout(1);
             py::list out;
             for (std::size_t i = 0; i < l.num_fields(); ++i) out.append(py::make_tuple(l.field(i).dtype, l.field(i).shape));
             return out;
           },
           "(dtype string, per-sample shape) of the batch's fields: image, label.");

  m.def(
      "pipeline_loader",
      [](std::shared_ptr<const Pipeline> pipe, const py::buffer& order, uint32_t batch_size, bool drop_last,
         int num_workers, bool threads, uint64_t seed, uint64_t epoch, int prefetch_factor, double timeout,
         std::optional<int64_t> max_threads) {
        std::vector<int64_t> indices = int64_vector(order, "order");
        const bool stream = pipe->streaming();
        BatchPlan plan = stream ? BatchPlan::chunked({}, batch_size, false)
                                : BatchPlan::chunked(std::move(indices), batch_size, drop_last);
        LoaderOptions o;
        o.round_robin = stream;  // a stream: batch k from worker k mod N, until every worker's shards end
        o.num_workers = num_workers;
        o.batch_capacity = batch_size;
        o.slot_bytes = pipe->layout(batch_size).bytes();  // every batch has this size: reserve it up front
        o.prefetch_factor = prefetch_factor;
        o.timeout = timeout_ms(timeout);
        o.max_threads = max_threads;
        o.on_stall = stall_warning();
        if (pipe->options().on_error == PipelineOptions::OnError::kSkip)  // the loader enforces it (loader.hpp)
          o.max_skip_ratio = pipe->options().max_skip_ratio;
        WorkerMain body = stream ? pipeline_stream_worker(pipe, seed, epoch) : pipeline_worker(pipe, seed, epoch);
        if (threads) {
          py::gil_scoped_release release;  // nothing forks: the workers are C++ on arena threads
          return std::make_unique<Loader>(o, std::move(plan), Launcher::threads(std::move(body)));
        }
        // Forked from Python: the interpreter's fork protocol (the GIL stays held); the
        // child runs only C++.
        return std::make_unique<Loader>(o, std::move(plan), Launcher::fork(std::move(body), interpreter_fork_hooks()));
      },
      py::kw_only(), py::arg("pipeline"), py::arg("order"), py::arg("batch_size"), py::arg("drop_last") = false,
      py::arg("num_workers"), py::arg("threads") = false, py::arg("seed"), py::arg("epoch"),
      py::arg("prefetch_factor") = 2, py::arg("timeout") = 0.0, py::arg("max_threads") = py::none(),
      "A runtime Loader whose workers (forked processes, or arena threads with threads=True) run the "
      "pipeline over `order` in batches.");
}

}  // namespace spindle::python
