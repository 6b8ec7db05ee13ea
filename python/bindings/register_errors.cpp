// Maps the runtime's exceptions onto the Python classes in spindle/errors.py.
#include <spindle/error.hpp>

#include <system_error>

#include "register.hpp"

namespace py = pybind11;

namespace spindle::python {

void register_errors(py::module_& m) {
  // Looked up once and kept for the life of the interpreter.
  py::module_ errors = py::module_::import("spindle.errors");
  static PyObject* budget = py::object(errors.attr("ThreadBudgetError")).release().ptr();
  static PyObject* shm = py::object(errors.attr("SharedMemoryError")).release().ptr();
  static PyObject* died = py::object(errors.attr("WorkerDiedError")).release().ptr();
  static PyObject* timeout = py::object(errors.attr("LoaderTimeoutError")).release().ptr();
  static PyObject* failed = py::object(errors.attr("BatchFailedError")).release().ptr();
  static PyObject* data = py::object(errors.attr("DataError")).release().ptr();
  static PyObject* decode = py::object(errors.attr("DecodeError")).release().ptr();
  (void)m;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ThreadBudgetError& e) {
      PyErr_SetString(budget, e.what());
    } catch (const SharedMemoryError& e) {
      PyErr_SetString(shm, e.what());
    } catch (const WorkerDiedError& e) {
      PyErr_SetString(died, e.what());
    } catch (const LoaderTimeoutError& e) {
      PyErr_SetString(timeout, e.what());
    } catch (const DataError& e) {
      PyErr_SetString(data, e.what());
    } catch (const DecodeError& e) {
      PyErr_SetString(decode, e.what());
    } catch (const BatchFailedError& e) {
      // The message embeds the worker's report, which the Python layer
      // pickles: decode leniently, the exact bytes travel in `payload`.
      const std::string what = e.what();
      py::object message = py::reinterpret_steal<py::object>(
          PyUnicode_DecodeUTF8(what.data(), static_cast<Py_ssize_t>(what.size()), "replace"));
      py::object inst = py::reinterpret_borrow<py::object>(failed)(
          message, e.worker_id, e.pid, e.batch_id, py::bytes(e.payload));
      PyErr_SetObject(failed, inst.ptr());
    } catch (const std::system_error& e) {
      // OSError(errno, message): Python code can test .errno like for os.fork().
      py::object inst = py::reinterpret_borrow<py::object>(PyExc_OSError)(e.code().value(), e.what());
      PyErr_SetObject(PyExc_OSError, inst.ptr());
    }
  });
}

}  // namespace spindle::python
