#include "fork_protocol.hpp"

#include <Python.h>
#include <pthread.h>
#include <signal.h>

#include <memory>
#include <thread>

#include <pybind11/pybind11.h>

#include <spindle/budget_ledger.hpp>

namespace py = pybind11;

namespace spindle::python {
namespace {

// A failed flush (a closed or broken stream) is the parent's to meet at its
// own next write; it must not stop the fork.
void flush_python_stdio() {
  for (const char* name : {"stdout", "stderr"}) {
    PyObject* stream = PySys_GetObject(name);  // borrowed
    if (stream == nullptr || stream == Py_None) continue;
    PyObject* r = PyObject_CallMethod(stream, "flush", nullptr);
    if (r == nullptr) PyErr_Clear();
    Py_XDECREF(r);
  }
}

}  // namespace

// The interpreter's own fork protocol: takes the import lock and the GIL's
// internals around fork and re-initializes threading state in the child,
// exactly as os.fork() does.
//
// Signals are blocked from before each fork until its hooks have run, in both
// processes: the interpreter runs Python at-fork callbacks there (logging's,
// concurrent.futures'), and a signal handler that ran inside one would have
// its exception printed and dropped (a Ctrl-C lost). A signal that arrives
// meanwhile is delivered when the mask is restored; one already pending is
// handled first, and its exception (KeyboardInterrupt) stops the start.
//
// sys.stdout and sys.stderr are flushed here, in the parent, before each fork
// (as multiprocessing does before its forks): their buffers are Python objects
// the child would otherwise inherit and flush again when its worker main ends,
// repeating the parent's pending output once per worker. The runtime's own
// forks drop the C stdio buffers a child inherits (runtime/src/child_stdio.hpp).
ForkHooks interpreter_fork_hooks() {
  struct State {
    sigset_t blocked;  // what the hooks block (and unblock again): not what was blocked before
    PyGILState_STATE gil;
  };
  auto state = std::make_shared<State>();
  sigemptyset(&state->blocked);
  // Python's half of a fork of spindle's (spindle._runtime.forking.forking()): entered here for a
  // fork the runtime makes on its own (a lost worker's replacement, from next() without the GIL);
  // nothing when the fork is already inside it (the workers a Loader starts).
  auto around = [](const char* name) {
    py::module_::import("spindle._runtime.forking").attr(name)();
  };
  return ForkHooks{[state, around] {
                     state->gil = PyGILState_Ensure();  // held from here to the fork's end (parent and child)
                     try {
                       flush_python_stdio();
                       sigset_t all, before;
                       sigfillset(&all);
                       for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS})
                         sigdelset(&all, sig);  // faults are raised synchronously; blocked, they kill
                       pthread_sigmask(SIG_BLOCK, &all, &before);
                       sigemptyset(&state->blocked);
                       for (int sig = 1; sig < NSIG; ++sig)
                         if (sigismember(&all, sig) == 1 && sigismember(&before, sig) == 0)
                           sigaddset(&state->blocked, sig);
                       if (PyErr_CheckSignals() != 0) throw py::error_already_set();
                       around("enter_fork");
                     } catch (...) {
                       pthread_sigmask(SIG_UNBLOCK, &state->blocked, nullptr);
                       PyGILState_Release(state->gil);
                       throw;
                     }
                     PyOS_BeforeFork();
                   },
                   [state, around] {
                     PyOS_AfterFork_Parent();
                     try {  // before the signals are unblocked: a handler must not run in here (it is lost)
                       around("leave_fork");
                     } catch (py::error_already_set& e) {
                       e.discard_as_unraisable("spindle: leaving a fork");
                     }
                     pthread_sigmask(SIG_UNBLOCK, &state->blocked, nullptr);
                     PyGILState_Release(state->gil);
                   },
                   [state] {
                     PyOS_AfterFork_Child();  // the child goes on holding the GIL: its worker main is Python
                     pthread_sigmask(SIG_UNBLOCK, &state->blocked, nullptr);
                   }};
}

std::function<void()> budget_poll() {
  return [] {
    {
      py::gil_scoped_release release;
      std::this_thread::sleep_for(BudgetLedger::kPollPeriod);
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  };
}

std::function<void(const std::string&)> stall_warning() {
  return [](const std::string& message) {
    py::gil_scoped_acquire gil;
    py::object cls = py::module_::import("spindle.errors").attr("StallWarning");
    if (PyErr_WarnEx(cls.ptr(), message.c_str(), 1) != 0) throw py::error_already_set();
  };
}

std::function<void(const std::string&)> worker_replaced() {
  return [](const std::string& message) {
    py::gil_scoped_acquire gil;
    py::module_::import("spindle._runtime.failures").attr("worker_replaced")(message);
  };
}

std::function<void(const std::string&)> processes_resized() {
  return [](const std::string& message) {
    py::gil_scoped_acquire gil;
    py::module_::import("logging").attr("getLogger")("spindle").attr("info")("%s", message);
  };
}

void set_python_callbacks(LoaderOptions& o) {
  o.on_stall = stall_warning();
  o.on_replaced = worker_replaced();
  o.on_resized = processes_resized();
}

std::function<void()> next_poll() {
  return [] {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  };
}

}  // namespace spindle::python
