#pragma once
// Errors the runtime throws. Every message says what happened, to which
// worker/batch/sample, and what the user can change; the source location is
// attached by SPINDLE_THROW so a report from the field points at the line.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <system_error>

namespace spindle {

// The thread budget cannot hold the requested workers.
class ThreadBudgetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Shared memory could not be created or reserved (e.g. /dev/shm too small).
class SharedMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A worker process died (signal or exit) while the loader was running.
class WorkerDiedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// No batch arrived within the loader's timeout.
class LoaderTimeoutError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A worker reported that producing a batch failed. `payload` is whatever the
// worker wrote (the C++ API writes the exception text; the Python layer writes
// a pickled exception with its traceback).
class BatchFailedError : public std::runtime_error {
 public:
  BatchFailedError(const std::string& what, int worker_id, int pid,
                   int64_t batch_id, std::string payload)
      : std::runtime_error(what),
        worker_id(worker_id),
        pid(pid),
        batch_id(batch_id),
        payload(std::move(payload)) {}
  int worker_id;
  int pid;
  int64_t batch_id;
  std::string payload;
};

// Input data is malformed: a corrupt or truncated tar shard, a .npy file with
// an unusable header, a label that is not a number. The message names the file
// (shard, key, byte offset) so the user can find and replace it. Distinct from
// std::invalid_argument, which is for misuse of the API.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Encoded image bytes could not be decoded (truncated, corrupt, empty, not a
// JPEG/PNG, or over kMaxImagePixels). The message carries the decoder's own.
class DecodeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
std::string location_suffix(const char* file, int line);
}  // namespace detail

}  // namespace spindle

// Throws `Type(message + " [file:line]")`.
#define SPINDLE_THROW(Type, message)                                     \
  throw Type(std::string(message) +                                      \
             ::spindle::detail::location_suffix(__FILE__, __LINE__))

// Throws std::system_error for the current errno with a message and location.
#define SPINDLE_THROW_ERRNO(message)                                     \
  throw std::system_error(errno, std::generic_category(),                \
                          std::string(message) +                         \
                              ::spindle::detail::location_suffix(__FILE__, __LINE__))
