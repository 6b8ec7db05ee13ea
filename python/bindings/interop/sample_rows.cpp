#include "sample_rows.hpp"

#include <bit>
#include <cstring>
#include <stdexcept>
#include <string>

#include <pybind11/numpy.h>

namespace py = pybind11;

namespace spindle::python {
namespace {

// The element type a Python bool/int/float becomes in a batch (as numpy's
// asarray makes it): a 0-d field of exactly that dtype takes one.
constexpr bool kLittle = std::endian::native == std::endian::little;
const char* const kInt64 = kLittle ? "<i8" : ">i8";
const char* const kFloat64 = kLittle ? "<f8" : ">f8";

// Dict keys are compared without running Python code (the walk holds
// pointers into the dict): the same object, or equal str/int keys.
bool same_key(PyObject* key, PyObject* want) {
  if (key == want) return true;
  if (Py_TYPE(key) != Py_TYPE(want) || !(PyUnicode_CheckExact(key) || PyLong_CheckExact(key))) return false;
  const int eq = PyObject_RichCompareBool(key, want, Py_EQ);
  if (eq < 0) PyErr_Clear();
  return eq == 1;
}

}  // namespace

void SampleRows::Gathered::release_views() noexcept {
  for (Py_buffer& v : views) PyBuffer_Release(&v);
  views.clear();
}

SampleRows::Gathered::~Gathered() { release_views(); }

SampleRows::SampleRows(const py::list& walk, SlotLayout layout, py::bytes structure, const py::list& scalar_types)
    : layout_(std::move(layout)), structure_(structure) {
  std::size_t leaves = 0;
  for (py::handle op : walk) {
    auto t = op.cast<py::tuple>();
    const auto kind = t[0].cast<std::string>();
    Node n;
    if (kind == "leaf") {
      ++leaves;
    } else if (kind == "seq") {
      n.kind = Node::Kind::kSequence;
      n.cls = py::reinterpret_borrow<py::object>(t[1]);
      if (!PyType_Check(n.cls.ptr()) || !(PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(n.cls.ptr()), &PyTuple_Type) ||
                                          PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(n.cls.ptr()), &PyList_Type)))
        throw py::type_error("spindle: a 'seq' node needs a tuple or list type");
      n.size = t[2].cast<std::size_t>();
    } else if (kind == "dict") {
      n.kind = Node::Kind::kDict;
      for (py::handle k : t[1].cast<py::tuple>()) n.keys.push_back(py::reinterpret_borrow<py::object>(k));
      n.size = n.keys.size();
    } else {
      throw py::value_error("spindle: unknown node '" + kind + "' in a sample walk");
    }
    nodes_.push_back(std::move(n));
  }
  if (leaves != layout_.num_fields() || scalar_types.size() != leaves)
    throw py::value_error("spindle: the walk has " + std::to_string(leaves) + " leaves for " +
                          std::to_string(layout_.num_fields()) + " fields and " + std::to_string(scalar_types.size()) +
                          " scalar types");
  for (std::size_t f = 0; f < leaves; ++f) {
    const FieldSpec& spec = layout_.field(f);
    Field field;
    field.descr = py::dtype(spec.dtype);
    field.shape = spec.shape;
    field.scalar_type = py::reinterpret_borrow<py::object>(scalar_types[f]);
    buffer_fields_ += field.scalar_type.is_none() ? 0 : 1;
    if (spec.shape.empty()) {
      field.takes_int = spec.dtype == kInt64;
      field.takes_float = spec.dtype == kFloat64;
      field.takes_bool = spec.dtype == "|b1";
    }
    fields_.push_back(std::move(field));
  }
}

bool SampleRows::leaf(PyObject* value, std::size_t f, std::size_t sample, Gathered& out) const {
  const Field& field = fields_[f];
  const std::size_t at = sample * fields_.size() + f;
  const auto& api = py::detail::npy_api::get();
  if (api.PyArray_Check_(value)) {
    const auto* a = py::detail::array_proxy(value);
    if (static_cast<std::size_t>(a->nd) != field.shape.size() ||
        !(a->flags & py::detail::npy_api::NPY_ARRAY_C_CONTIGUOUS_))
      return false;
    for (std::size_t k = 0; k < field.shape.size(); ++k)
      if (a->dimensions[k] != field.shape[k]) return false;
    if (a->descr != field.descr.ptr()) {  // builtin dtypes are singletons: this is rare
      const int eq = PyObject_RichCompareBool(a->descr, field.descr.ptr(), Py_EQ);
      if (eq < 0) PyErr_Clear();
      if (eq != 1) return false;
    }
    out.rows[at] = reinterpret_cast<const std::byte*>(a->data);
    out.kinds[at] = Leaf::kArray;
    if (out.hold_arrays) out.arrays.push_back(py::reinterpret_borrow<py::object>(value));
    return true;
  }
  std::byte* scalar = out.scalars[at].data();
  if (field.takes_int && PyLong_CheckExact(value)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;  // the general path raises numpy's OverflowError
    }
    const int64_t v64 = v;
    std::memcpy(scalar, &v64, sizeof v64);
    out.kinds[at] = Leaf::kInt;
  } else if (field.takes_float && PyFloat_CheckExact(value)) {
    const double v = PyFloat_AS_DOUBLE(value);
    std::memcpy(scalar, &v, sizeof v);
    out.kinds[at] = Leaf::kFloat;
  } else if (field.takes_bool && PyBool_Check(value)) {
    scalar[0] = std::byte{value == Py_True};
    out.kinds[at] = Leaf::kBool;
  } else if (!field.scalar_type.is_none() && Py_TYPE(value) == reinterpret_cast<PyTypeObject*>(field.scalar_type.ptr())) {
    Py_buffer view;  // a numpy scalar's buffer is its value
    if (PyObject_GetBuffer(value, &view, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      return false;
    }
    if (static_cast<uint64_t>(view.len) != layout_.row_bytes(f)) {
      PyBuffer_Release(&view);
      return false;
    }
    out.views.push_back(view);  // within the reserved capacity
    out.rows[at] = static_cast<const std::byte*>(view.buf);
    out.kinds[at] = Leaf::kNumpyScalar;
    return true;
  } else {
    return false;
  }
  out.rows[at] = scalar;
  return true;
}

bool SampleRows::walk(PyObject* value, std::size_t& node, std::size_t& field, std::size_t sample,
                      Gathered& out) const {
  const Node& n = nodes_[node++];
  switch (n.kind) {
    case Node::Kind::kLeaf:
      return leaf(value, field++, sample, out);
    case Node::Kind::kSequence: {
      if (Py_TYPE(value) != reinterpret_cast<PyTypeObject*>(n.cls.ptr()) ||
          static_cast<std::size_t>(PySequence_Fast_GET_SIZE(value)) != n.size)
        return false;
      PyObject** items = PySequence_Fast_ITEMS(value);
      for (std::size_t i = 0; i < n.size; ++i)
        if (!walk(items[i], node, field, sample, out)) return false;
      return true;
    }
    case Node::Kind::kDict: {
      if (!PyDict_CheckExact(value) || static_cast<std::size_t>(PyDict_GET_SIZE(value)) != n.size) return false;
      Py_ssize_t pos = 0;
      PyObject *key = nullptr, *item = nullptr;
      for (std::size_t i = 0; PyDict_Next(value, &pos, &key, &item); ++i)
        if (!same_key(key, n.keys[i].ptr()) || !walk(item, node, field, sample, out)) return false;
      return true;
    }
  }
  return false;
}

bool SampleRows::gather(const py::list& samples, Gathered& out) const {
  const std::size_t count = samples.size(), fields = fields_.size();
  out.rows.assign(count * fields, nullptr);
  out.scalars.resize(count * fields);
  out.kinds.resize(count * fields);
  out.arrays.reserve(count * fields);
  out.views.reserve(count * buffer_fields_);  // never moves: each view is released where it is
  for (std::size_t s = 0; s < count; ++s) {
    std::size_t node = 0, field = 0;
    if (!walk(PyList_GET_ITEM(samples.ptr(), static_cast<Py_ssize_t>(s)), node, field, s, out)) {
      return false;  // `out` lets go of what it holds when destroyed
    }
  }
  return true;
}

bool SampleRows::gather_one(PyObject* sample, Gathered& out) const {
  const std::size_t fields = fields_.size();
  out.release_views();
  out.hold_arrays = false;
  out.rows.resize(fields);
  out.scalars.resize(fields);
  out.kinds.resize(fields);
  out.views.reserve(buffer_fields_);
  std::size_t node = 0, field = 0;
  return walk(sample, node, field, 0, out);
}

}  // namespace spindle::python
