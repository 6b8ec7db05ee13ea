// Maps the runtime's exceptions onto the Python classes in spindle/errors.py,
// with their fields as attributes (errors are data: nobody parses a message).
#include <spindle/error.hpp>

#include <optional>
#include <string>
#include <system_error>

#include "register.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace spindle::python {
namespace {

// Messages and names may hold bytes that are not UTF-8 (a file name, a
// worker's report): decoded leniently, never a second error.
py::object text(const std::string& s) {
  return py::reinterpret_steal<py::object>(
      PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace"));
}

// An empty path or key means "not known": None in Python.
py::object name_or_none(const std::string& s) { return s.empty() ? py::none() : text(s); }

template <class T>
py::object or_none(const std::optional<T>& v) {
  return v ? py::cast(*v) : py::none();
}

// Raises `cls(message, **fields)`.
void raise(PyObject* cls, const py::object& inst) { PyErr_SetObject(cls, inst.ptr()); }

}  // namespace

void register_errors(py::module_& m) {
  // Looked up once and kept for the life of the interpreter.
  py::module_ errors = py::module_::import("spindle.errors");
  static PyObject* budget = py::object(errors.attr("ThreadBudgetError")).release().ptr();
  static PyObject* shm = py::object(errors.attr("SharedMemoryError")).release().ptr();
  static PyObject* died = py::object(errors.attr("WorkerDiedError")).release().ptr();
  static PyObject* timeout = py::object(errors.attr("LoaderTimeoutError")).release().ptr();
  static PyObject* advised = py::object(errors.attr("ProcessesAdvised")).release().ptr();
  static PyObject* failed = py::object(errors.attr("BatchFailedError")).release().ptr();
  static PyObject* data = py::object(errors.attr("DataError")).release().ptr();
  static PyObject* decode = py::object(errors.attr("DecodeError")).release().ptr();
  static PyObject* internal = py::object(errors.attr("InternalError")).release().ptr();
  static PyObject* skips = py::object(errors.attr("SkipRatioError")).release().ptr();
  (void)m;
  py::register_exception_translator([](std::exception_ptr p) {
    auto cls = [](PyObject* c) { return py::reinterpret_borrow<py::object>(c); };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ThreadBudgetError& e) {
      PyErr_SetString(budget, e.what());
    } catch (const SharedMemoryError& e) {
      PyErr_SetString(shm, e.what());
    } catch (const WorkerDiedError& e) {
      raise(died, cls(died)(text(e.what()), "pid"_a = e.pid > 0 ? py::cast(e.pid) : py::none(),
                            "exitcode"_a = or_none(e.exitcode), "signal"_a = or_none(e.signal),
                            "worker"_a = e.worker >= 0 ? py::cast(e.worker) : py::none(),
                            "sample"_a = or_none(e.sample), "batch"_a = or_none(e.batch)));
    } catch (const LoaderTimeoutError& e) {
      PyErr_SetString(timeout, e.what());
    } catch (const ProcessesAdvised& e) {
      PyErr_SetString(advised, e.what());
    } catch (const SkipRatioError& e) {  // before DataError, its base
      raise(skips, cls(skips)(text(e.what()), "skipped"_a = e.skipped, "samples"_a = e.samples,
                              "max_ratio"_a = e.max_ratio));
    } catch (const DataError& e) {
      raise(data, cls(data)(text(e.what()), "path"_a = name_or_none(e.path), "key"_a = name_or_none(e.key)));
    } catch (const DecodeError& e) {
      raise(decode, cls(decode)(text(e.what()), "path"_a = name_or_none(e.path), "key"_a = name_or_none(e.key)));
    } catch (const InternalError& e) {
      PyErr_SetString(internal, e.what());
    } catch (const BatchFailedError& e) {
      // The message embeds the worker's report, which the Python layer
      // pickles: decode leniently, the exact bytes travel in `payload`.
      raise(failed, cls(failed)(text(e.what()), e.worker_id, e.pid, e.batch_id, py::bytes(e.payload),
                                "kind"_a = failure_kind_name(e.kind), "path"_a = name_or_none(e.path),
                                "key"_a = name_or_none(e.key)));
    } catch (const std::system_error& e) {
      // OSError(errno, message): Python code can test .errno like for os.fork().
      py::object inst = py::reinterpret_borrow<py::object>(PyExc_OSError)(e.code().value(), e.what());
      PyErr_SetObject(PyExc_OSError, inst.ptr());
    }
  });
}

}  // namespace spindle::python
