// The segments under spindle.shared's containers: SharedSegment (made and
// written once by the consumer, then sealed read-only) and SegmentView (the
// read-only mapping a process that did not fork from the maker opens from a
// descriptor). Both are buffers; converting is all this file does, the
// segments' lifetime rules are ShmSegment's (shm_segment.hpp).
//
// And the other way a forked worker reads a container of plain values without
// copying it: in place (inherited_item). Reading a Python object writes its
// reference count, so a worker that reads the consumer's list of paths copies
// every page it touches; inherited_item copies item i out through borrowed
// pointers instead, writing nothing of the consumer's objects.
#include <memory>

#include <spindle/shm_segment.hpp>

#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {
namespace {

constexpr int kMaxPlainDepth = 32;

// Exact str, bytes, int, float, bool, None, or a list, tuple or dict of them:
// values copy_plain can copy without running any Python code.
bool is_plain(PyObject* o, int depth) {
  if (o == Py_None || PyBool_Check(o) || PyLong_CheckExact(o) || PyFloat_CheckExact(o) || PyBytes_CheckExact(o))
    return true;
  if (PyUnicode_CheckExact(o)) {
#if PY_VERSION_HEX < 0x030C0000
    return PyUnicode_IS_READY(o);  // a legacy string would be made ready: written
#else
    return true;
#endif
  }
  if (depth >= kMaxPlainDepth) return false;
  if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
    const bool list = PyList_CheckExact(o);
    const Py_ssize_t n = list ? PyList_GET_SIZE(o) : PyTuple_GET_SIZE(o);
    for (Py_ssize_t i = 0; i < n; ++i)
      if (!is_plain(list ? PyList_GET_ITEM(o, i) : PyTuple_GET_ITEM(o, i), depth + 1)) return false;
    return true;
  }
  if (PyDict_CheckExact(o)) {
    Py_ssize_t pos = 0;
    PyObject* key = nullptr;
    PyObject* value = nullptr;
    while (PyDict_Next(o, &pos, &key, &value))  // borrowed
      if (!is_plain(key, depth + 1) || !is_plain(value, depth + 1)) return false;
    return true;
  }
  return false;
}

// A new object equal to the plain value `o` (is_plain), read through borrowed
// pointers only: none of o's objects is written (an int too large for 64 bits
// is the exception: it is shared, as its own reference). nullptr with a Python
// error set if memory runs out. The caller keeps the collector off, so no
// Python code runs while the pointers are followed.
PyObject* copy_plain(PyObject* o) {
  if (o == Py_None || PyBool_Check(o)) return Py_NewRef(o);
  if (PyLong_CheckExact(o)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    return overflow ? Py_NewRef(o) : PyLong_FromLongLong(v);
  }
  if (PyFloat_CheckExact(o)) return PyFloat_FromDouble(PyFloat_AS_DOUBLE(o));
  if (PyBytes_CheckExact(o)) return PyBytes_FromStringAndSize(PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o));
  if (PyUnicode_CheckExact(o))
    return PyUnicode_FromKindAndData(PyUnicode_KIND(o), PyUnicode_DATA(o), PyUnicode_GET_LENGTH(o));
  if (PyList_CheckExact(o) || PyTuple_CheckExact(o)) {
    const bool list = PyList_CheckExact(o);
    const Py_ssize_t n = list ? PyList_GET_SIZE(o) : PyTuple_GET_SIZE(o);
    PyObject* out = list ? PyList_New(n) : PyTuple_New(n);
    for (Py_ssize_t i = 0; out != nullptr && i < n; ++i) {
      PyObject* item = copy_plain(list ? PyList_GET_ITEM(o, i) : PyTuple_GET_ITEM(o, i));
      if (item == nullptr) Py_CLEAR(out);
      else if (list) PyList_SET_ITEM(out, i, item);
      else PyTuple_SET_ITEM(out, i, item);
    }
    return out;
  }
  PyObject* out = PyDict_New();
  Py_ssize_t pos = 0;
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  while (out != nullptr && PyDict_Next(o, &pos, &key, &value)) {
    PyObject* k = copy_plain(key);
    PyObject* v = k == nullptr ? nullptr : copy_plain(value);
    if (v == nullptr || PyDict_SetItem(out, k, v) < 0) Py_CLEAR(out);
    Py_XDECREF(k);
    Py_XDECREF(v);
  }
  return out;
}

// Runs `fn` with the cyclic collector off: an allocation cannot start a
// collection, whose finalizers could change what the borrowed pointers point to.
template <typename Fn>
auto without_collector(Fn fn) {
  const int was = PyGC_Disable();
  struct Restore {
    int was;
    ~Restore() {
      if (was) PyGC_Enable();
    }
  } restore{was};
  return fn();
}

PyObject* checked_sequence(py::handle items) {
  PyObject* c = items.ptr();
  if (!PyList_CheckExact(c) && !PyTuple_CheckExact(c))
    throw py::type_error("spindle: inherited_item reads a list or a tuple, not " +
                         std::string(Py_TYPE(c)->tp_name));
  return c;
}

struct SealableSegment {
  std::unique_ptr<ShmSegment> segment;
  bool sealed = false;
};

}  // namespace

void register_shared(py::module_& m) {
  m.def(
      "plain_values",
      [](py::handle items) {
        PyObject* c = checked_sequence(items);
        return without_collector([c] {
          const bool list = PyList_CheckExact(c);
          const Py_ssize_t n = list ? PyList_GET_SIZE(c) : PyTuple_GET_SIZE(c);
          for (Py_ssize_t i = 0; i < n; ++i)
            if (!is_plain(list ? PyList_GET_ITEM(c, i) : PyTuple_GET_ITEM(c, i), 1)) return false;
          return true;
        });
      },
      py::arg("items"),
      "Whether every item of the list or tuple is a plain value (exact str, bytes, int, float, bool, None, "
      "or lists, tuples and dicts of them), which inherited_item copies without writing the original.");
  m.def(
      "inherited_item",
      [](py::handle items, py::ssize_t i) {
        PyObject* c = checked_sequence(items);
        const Py_ssize_t n = PyList_CheckExact(c) ? PyList_GET_SIZE(c) : PyTuple_GET_SIZE(c);
        if (i < 0 || i >= n) throw py::index_error("spindle: inherited_item index out of range");
        PyObject* o = PyList_CheckExact(c) ? PyList_GET_ITEM(c, i) : PyTuple_GET_ITEM(c, i);
        PyObject* copy = without_collector([o] { return is_plain(o, 1) ? copy_plain(o) : Py_NewRef(o); });
        if (copy == nullptr) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(copy);
      },
      py::arg("items"), py::arg("i"),
      "items[i] for a list or tuple a forked process inherited: a plain value is copied out through borrowed "
      "pointers, writing nothing of the original (whose pages then stay shared with the process it came "
      "from); anything else is items[i] itself.");
  py::class_<SealableSegment>(m, "SharedSegment", py::buffer_protocol(),
                              "A shared memory segment without a name (unlinked at creation: nothing is left in "
                              "/dev/shm whatever ends the process), written once, then sealed read-only. Forked "
                              "processes inherit its mapping; others map it from its descriptor (SegmentView).")
      .def(py::init([](std::size_t bytes, const std::string& what) {
             py::gil_scoped_release release;
             return SealableSegment{std::make_unique<ShmSegment>(bytes, what), false};
           }),
           py::arg("bytes"), py::arg("what"),
           "A segment of `bytes`, backed now; SharedMemoryError (naming `what`) if /dev/shm is too full.")
      .def_buffer([](SealableSegment& s) {
        return py::buffer_info(s.segment->data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(s.segment->size())}, {1}, /*readonly=*/s.sealed);
      })
      .def("seal",
           [](SealableSegment& s) {
             s.segment->seal();
             s.sealed = true;
           },
           "Makes the mapping read-only here and in every process forked later. Buffers taken before stay "
           "writable in name only: a write through them faults.")
      .def_property_readonly("sealed", [](const SealableSegment& s) { return s.sealed; })
      .def_property_readonly("fd", [](const SealableSegment& s) { return s.segment->fd(); },
                             "Its descriptor (close-on-exec), to hand to a process that is not a fork.")
      .def_property_readonly("size", [](const SealableSegment& s) { return s.segment->size(); });

  py::class_<SegmentView>(m, "SegmentView", py::buffer_protocol(),
                          "A read-only mapping of a whole segment, from a descriptor of it (kept duplicated: "
                          "the caller may close theirs).")
      .def(py::init([](int fd) {
             py::gil_scoped_release release;
             return std::make_unique<SegmentView>(fd);
           }),
           py::arg("fd"))
      .def_buffer([](SegmentView& v) {
        return py::buffer_info(const_cast<std::byte*>(v.data()), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(v.size())}, {1}, /*readonly=*/true);
      })
      .def_property_readonly("fd", &SegmentView::fd)
      .def_property_readonly("size", &SegmentView::size);
}

}  // namespace spindle::python
