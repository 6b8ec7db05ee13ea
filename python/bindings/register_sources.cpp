// Data sources (runtime/include/spindle/sources.hpp): ImageFolder, ArraySource,
// WebDataset. Lambdas convert types and release the GIL around file access.
#include <mutex>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <spindle/sources.hpp>

#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {
namespace {

py::bytes to_bytes(const std::vector<std::byte>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

// A read-only numpy view of `bytes` at `data`, keeping `owner` alive.
py::array view(const ArraySource& a, const std::byte* data, std::vector<int64_t> shape, py::handle owner) {
  std::vector<py::ssize_t> dims(shape.begin(), shape.end()), strides(dims.size());
  py::ssize_t stride = static_cast<py::ssize_t>(a.itemsize());
  for (std::size_t k = dims.size(); k-- > 0;) {
    strides[k] = stride;
    stride *= dims[k];
  }
  py::array out(py::dtype(a.dtype()), dims, strides, data, owner);
  py::detail::array_proxy(out.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return out;
}

// One pass over one shard, as a Python iterator of webdataset-style dicts.
class ShardIterator {
 public:
  ShardIterator(const WebDataset& ds, std::size_t shard) : reader_(ds, shard) {}
  py::dict next() {
    std::optional<WdsSample> s;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);  // two Python threads may share the iterator
      s = reader_.next();
    }
    if (!s) throw py::stop_iteration();
    py::dict d;
    d["__key__"] = s->key;
    d["__url__"] = reader_.shard();
    for (const auto& [field, bytes] : s->fields) d[py::str(field)] = to_bytes(bytes);
    return d;
  }

 private:
  std::mutex mu_;
  WdsShardReader reader_;
};

}  // namespace

void register_sources(py::module_& m) {
  py::class_<ImageFolder>(m, "ImageFolder",
                          "Images in the ImageNet layout root/<class>/<file>, ordered and labelled by "
                          "torchvision.datasets.ImageFolder's rule (its IMG_EXTENSIONS: .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, any case).")
      .def(py::init([](std::string root) {
             py::gil_scoped_release release;
             return std::make_unique<ImageFolder>(std::move(root));
           }),
           py::arg("root"))
      .def("__len__", &ImageFolder::size)
      .def_property_readonly("classes", &ImageFolder::classes, "Class names; a sample's label is an index into them.")
      .def_property_readonly("root", &ImageFolder::root)
      .def("path", &ImageFolder::path, py::arg("index"), "The file of sample `index`.")
      .def("label", &ImageFolder::label, py::arg("index"), "The class index of sample `index`.")
      .def(
          "read",
          [](const ImageFolder& f, std::size_t i) {
            Record r;
            {
              py::gil_scoped_release release;
              r = f.read(i);
            }
            return py::make_tuple(to_bytes(r.data), r.label, r.origin);
          },
          py::arg("index"), "(encoded bytes, label, origin) of sample `index`.");

  py::class_<ArraySource>(m, "ArraySource",
                          "Rows of a C-order array in a .npy file, memory-mapped read-only (sample i = row i).")
      .def_static(
          "from_npy",
          [](const std::string& path) {
            py::gil_scoped_release release;
            return ArraySource::from_npy(path);
          },
          py::arg("path"), "Maps `path`; refuses Fortran-order, object and structured arrays with DataError.")
      .def("__len__", &ArraySource::size)
      .def_property_readonly("dtype", &ArraySource::dtype, "numpy's type string, e.g. '<f4'.")
      .def_property_readonly("shape", &ArraySource::shape)
      .def_property_readonly("row_shape", &ArraySource::row_shape)
      .def(
          "row",
          [](py::object self, std::size_t i) {
            const ArraySource& a = self.cast<const ArraySource&>();
            return view(a, a.row(i).data(), a.row_shape(), self);
          },
          py::arg("index"), "Row `index` as a read-only numpy view of the mapping (no copy).")
      .def(
          "array",
          [](py::object self) {
            const ArraySource& a = self.cast<const ArraySource&>();
            return view(a, a.data(), a.shape(), self);
          },
          "All rows as one read-only numpy view of the mapping (no copy).");

  py::class_<ShardIterator>(m, "WebDatasetShardIterator", "One pass over one WebDataset shard.")
      .def("__iter__", [](ShardIterator& it) -> ShardIterator& { return it; })
      .def("__next__", &ShardIterator::next);

  py::class_<WebDataset>(m, "WebDataset",
                         "WebDataset tar shards: members grouped into samples by key, read streaming.")
      .def(py::init<std::vector<std::string>>(), py::arg("shards"))
      .def_property_readonly("num_shards", &WebDataset::num_shards)
      .def_property_readonly("shards", &WebDataset::shards)
      .def("shards_of_worker", &WebDataset::shards_of_worker, py::arg("worker"), py::arg("num_workers"),
           "Shard numbers of `worker` of `num_workers` (worker, worker + num_workers, ...).")
      .def(
          "iter_shard", [](const WebDataset& ds, std::size_t s) { return std::make_unique<ShardIterator>(ds, s); },
          py::arg("shard"),
          "The samples of shard `shard` in order, as dicts {'__key__', '__url__', extension: bytes}.")
      .def_static(
          "label_of",
          [](const py::dict& sample) {
            WdsSample s;
            if (sample.contains("__url__") && sample.contains("__key__"))
              s.origin = py::str(sample["__url__"]).cast<std::string>() + ":" +
                         py::str(sample["__key__"]).cast<std::string>();
            for (const char* f : {"cls", "json"})
              if (sample.contains(f)) {
                const std::string b = sample[f].cast<std::string>();
                const auto* p = reinterpret_cast<const std::byte*>(b.data());
                s.fields.emplace(f, std::vector<std::byte>(p, p + b.size()));
              }
            return WebDataset::label_of(s);
          },
          py::arg("sample"), "The label from 'cls' (decimal text) or 'json' ({\"label\": n}), else -1.");
}

}  // namespace spindle::python
