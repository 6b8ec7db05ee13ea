#include "routed_dataset.hpp"

#include <Python.h>

#include <stdexcept>

namespace py = pybind11;

namespace spindle::python {
namespace {

// A buffer's view, checked to be 1-D and contiguous with an item of one of
// `sizes` bytes and integer format (signed or not as `is_signed`).
py::buffer_info integer_column(const py::buffer& buffer, const char* name, std::size_t size_a, std::size_t size_b,
                               bool is_signed) {
  py::buffer_info info = buffer.request();
  const std::string& f = info.format;
  const char code = f.empty() ? '?' : f.back();  // "<i", "=l": the last character is the type
  const bool integer = is_signed ? (code == 'b' || code == 'h' || code == 'i' || code == 'l' || code == 'q')
                                 : (code == 'B' || code == 'H' || code == 'I' || code == 'L' || code == 'Q');
  const auto item = static_cast<std::size_t>(info.itemsize);
  if (info.ndim != 1 || !integer || (item != size_a && item != size_b) ||
      (info.shape[0] > 1 && info.strides[0] != info.itemsize))
    throw std::invalid_argument(std::string("spindle: RoutedDataset's ") + name + " should be a contiguous 1-D " +
                                (is_signed ? "int" : "uint") + std::to_string(8 * size_a) + " or " +
                                (is_signed ? "int" : "uint") + std::to_string(8 * size_b) + " array, but got format '" +
                                f + "' with " + std::to_string(info.ndim) + " dimension(s)");
  return info;
}

}  // namespace

RoutedDataset::RoutedDataset(const py::buffer& sources, const py::buffer& indices, const py::list& getters,
                             std::vector<std::string> names, std::string about)
    : sources_(integer_column(sources, "sources", 1, 4, false)),
      indices_(integer_column(indices, "indices", 4, 8, true)),
      size_(static_cast<std::size_t>(sources_.shape[0])),
      names_(std::move(names)),
      about_(std::move(about)) {
  if (indices_.shape[0] != sources_.shape[0])
    throw std::invalid_argument("spindle: RoutedDataset has " + std::to_string(sources_.shape[0]) + " sources but " +
                                std::to_string(indices_.shape[0]) + " indices; give one of each per element");
  if (names_.size() != py::len(getters))
    throw std::invalid_argument("spindle: RoutedDataset has " + std::to_string(py::len(getters)) + " getters but " +
                                std::to_string(names_.size()) + " names");
  for (py::handle getter : getters) {
    if (!PyCallable_Check(getter.ptr()))
      throw py::type_error("spindle: RoutedDataset's getters should be callables (the sources' bound __getitem__)");
    getters_.push_back(py::reinterpret_borrow<py::object>(getter));
  }
  // Every element's source must have a getter: checked once here, not at each read.
  const auto* one = static_cast<const uint8_t*>(sources_.ptr);
  const auto* four = static_cast<const uint32_t*>(sources_.ptr);
  for (std::size_t i = 0; i < size_; ++i) {
    const uint32_t j = sources_.itemsize == 1 ? one[i] : four[i];
    if (j >= getters_.size())
      throw std::invalid_argument("spindle: RoutedDataset's element " + std::to_string(i) + " has source " +
                                  std::to_string(j) + ", but there are " + std::to_string(getters_.size()) +
                                  " sources");
  }
}

std::pair<uint32_t, int64_t> RoutedDataset::locate(int64_t i) const {
  const auto n = static_cast<int64_t>(size_);
  const int64_t at = i < 0 ? i + n : i;
  if (at < 0 || at >= n)
    throw py::index_error("spindle.mix: index " + std::to_string(i) + " is out of range for a mix of " +
                          std::to_string(n) + " elements (" + about_ + ")");
  const uint32_t source = sources_.itemsize == 1 ? static_cast<const uint8_t*>(sources_.ptr)[at]
                                                 : static_cast<const uint32_t*>(sources_.ptr)[at];
  const int64_t index = indices_.itemsize == 4 ? static_cast<const int32_t*>(indices_.ptr)[at]
                                               : static_cast<const int64_t*>(indices_.ptr)[at];
  return {source, index};
}

std::string RoutedDataset::describe(int64_t i) const {
  const auto [source, index] = locate(i);
  return "spindle.mix: element " + std::to_string(i) + " is element " + std::to_string(index) + " of " +
         names_[source];
}

py::object RoutedDataset::get(int64_t i) const {
  const auto [source, index] = locate(i);
  PyObject* key = PyLong_FromLongLong(index);
  if (key == nullptr) throw py::error_already_set();
  PyObject* args[2] = {nullptr, key};  // args[0]: room for the bound method to put its self in
  PyObject* sample =
      PyObject_Vectorcall(getters_[source].ptr(), args + 1, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  Py_DECREF(key);
  if (sample != nullptr) return py::reinterpret_steal<py::object>(sample);
  // The source raised: the same exception, with a note saying where in the mix
  // it was (the worker's crash record names only the mix's index).
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  if (trace != nullptr) PyException_SetTraceback(value, trace);
  const std::string note = describe(i);
  PyObject* added = PyObject_CallMethod(value, "add_note", "s", note.c_str());
  if (added == nullptr)
    PyErr_Clear();  // an exception that takes no notes still propagates as it is
  else
    Py_DECREF(added);
  PyErr_Restore(type, value, trace);
  throw py::error_already_set();
}

const RoutedDataset* as_routed(py::handle dataset) {
  if (!py::isinstance<RoutedDataset>(dataset)) return nullptr;
  return &dataset.cast<const RoutedDataset&>();
}

}  // namespace spindle::python
