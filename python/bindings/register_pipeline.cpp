// Native pipelines: PipelineOptions (bound as an option struct), Pipeline, and
// the runtime Loader that runs one in forked workers or on arena threads.
#include <pybind11/stl.h>

#include <spindle/loader.hpp>
#include <spindle/pipeline.hpp>

#include "interop/color_args.hpp"
#include "interop/convert.hpp"
#include "interop/fork_protocol.hpp"
#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {

void register_pipeline(py::module_& m) {
  // Built-in stages (stage.hpp); adding one: one static method here.
  using Pair = std::pair<int, int>;
  const auto size = [](Pair p) { return ops::Size{p.first, p.second}; };
  py::class_<Stage>(m, "Stage", "One per-sample stage of a native pipeline (see stage.hpp); built by the static methods.")
      .def_property_readonly("name", [](const Stage& s) { return s.name; })
      .def_static("decode", &stages::decode)
      .def_static(
          "random_resized_crop",
          [size](Pair s, std::pair<double, double> scale, std::pair<double, double> ratio) {
            return stages::random_resized_crop(size(s), scale, ratio);
          },
          py::arg("size"), py::arg("scale"), py::arg("ratio"))
      .def_static("center_crop", [size](Pair s) { return stages::center_crop(size(s)); }, py::arg("size"))
      .def_static("resize_shorter", &stages::resize_shorter, py::arg("shorter"))
      .def_static("resize", [size](Pair s) { return stages::resize(size(s)); }, py::arg("size"))
      .def_static("random_flip", &stages::random_flip, py::arg("p"))
      .def_static(
          "color_jitter",
          [](const JitterArg& b, const JitterArg& c, const JitterArg& s, const JitterArg& h) {
            return stages::color_jitter(jitter_of(b, c, s, h));
          },
          py::arg("brightness"), py::arg("contrast"), py::arg("saturation"), py::arg("hue"))
      .def_static("random_grayscale", &stages::random_grayscale, py::arg("p"))
      .def_static("normalize", &stages::normalize, py::arg("mean"), py::arg("std"), py::arg("chw"));

  py::enum_<PipelineOptions::OnError>(m, "OnError")
      .value("RAISE", PipelineOptions::OnError::kRaise)
      .value("SKIP", PipelineOptions::OnError::kSkip);

  py::class_<PipelineOptions>(m, "PipelineOptions", "What a native pipeline reads and does (see pipeline.hpp).")
      .def(py::init<>())
      .def_readwrite("image_folder", &PipelineOptions::image_folder)
      .def_readwrite("npy", &PipelineOptions::npy)
      .def_readwrite("webdataset", &PipelineOptions::webdataset)
      .def_readwrite("webdataset_options", &PipelineOptions::webdataset_options)
      .def_readwrite("keep", &PipelineOptions::keep)
      .def_readwrite("stages", &PipelineOptions::stages)
      .def_readwrite("bytes_per_sample", &PipelineOptions::bytes_per_sample)
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
           "(dtype string, per-sample shape) of the batch's fields: image, label, then byte fields ('|u1', ()).")
      .def_property_readonly("field_names", &Pipeline::field_names,
                             "The batch's field names: 'image', 'label', then the byte fields.");

  m.def(
      "pipeline_loader",
      [](std::shared_ptr<const Pipeline> pipe, const LoaderOptions& options, const py::buffer& order, bool drop_last,
         bool threads, uint64_t seed, uint64_t epoch, std::vector<uint64_t> stream_starts) {
        PipelineEpoch e{int64_vector(order, "order"), seed, epoch, drop_last, std::move(stream_starts)};
        LoaderOptions o = options;
        set_python_callbacks(o);
        if (threads) {
          py::gil_scoped_release release;  // nothing forks: the workers are C++ on arena threads
          return make_pipeline_loader(std::move(pipe), std::move(e), std::move(o), PipelineMode::kThreads);
        }
        // Forked from Python: the interpreter's fork protocol (the GIL stays held); the
        // child runs only C++.
        o.budget_poll = budget_poll();
        return make_pipeline_loader(std::move(pipe), std::move(e), std::move(o), PipelineMode::kProcesses,
                                    interpreter_fork_hooks());
      },
      py::arg("pipeline"), py::arg("options"), py::kw_only(), py::arg("order"), py::arg("drop_last") = false,
      py::arg("threads") = false, py::arg("seed"), py::arg("epoch"), py::arg("stream_starts") = std::vector<uint64_t>{},
      "A runtime Loader whose workers (forked processes, or arena threads with threads=True) run the "
      "pipeline over `order` in batches of options.batch_capacity (make_pipeline_loader: the pipeline "
      "sets round_robin, logical_workers, slot_bytes and max_skip_ratio). A stream's `stream_starts`: "
      "each logical worker's Batch.stream_position of its last batch delivered (empty: from the start).");
}

}  // namespace spindle::python
