#pragma once
// Errors the runtime throws. Every message says what happened, to which
// worker/batch/sample, and what the user can change. Errors are data: the
// types below carry their fields (pid, signal, path, key...) set where they
// are raised, and the bindings copy them onto the Python exception, so no
// caller parses a message to recover them. User-facing messages carry no
// source location; InternalError (spindle's own bugs) does, so a report from
// the field points at the line.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

namespace spindle {

// What kind of failure a worker recorded in a failed slot
// (SlotHeader::failure, batch_ring.hpp), so the consumer knows what failed
// without reading the report's text. Shared memory: fixed values, never
// renumbered.
enum class FailureKind : uint32_t {
  kOther = 0,     // a C++ exception of another type; the report is its what()
  kPython = 1,    // a Python worker: the report is a pickled exception with its traceback
  kDecode = 2,    // DecodeError: encoded image bytes could not be decoded
  kData = 3,      // DataError: malformed input data (a bad shard, .npy or label)
  kInternal = 4,  // InternalError: a bug in spindle
};

// "python", "decode", "data", "internal", "other": the name the bindings give it.
const char* failure_kind_name(FailureKind kind) noexcept;

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

// A worker process died (signal or exit) while the loader was running. Built
// where the loader notices the death (Loader::check_workers), from the
// kernel's exit status and the worker's record in the ring.
class WorkerDiedError : public std::runtime_error {
 public:
  explicit WorkerDiedError(const std::string& what) : std::runtime_error(what) {}
  WorkerDiedError(const std::string& what, int worker, int pid, std::optional<int> exitcode,
                  std::optional<int> signal, std::optional<int64_t> sample, std::optional<int64_t> batch)
      : std::runtime_error(what),
        worker(worker),
        pid(pid),
        exitcode(exitcode),
        signal(signal),
        sample(sample),
        batch(batch) {}
  int worker = -1;                 // the worker's number, 0..num_workers-1 (-1: not known)
  int pid = 0;                     // its process id (0: not known)
  std::optional<int> exitcode;     // set if it exited (the status it passed to exit())
  std::optional<int> signal;       // set if a signal killed it (e.g. 9 for SIGKILL, 11 for SIGSEGV)
  std::optional<int64_t> sample;   // the sample index it was reading, if it had started one
  std::optional<int64_t> batch;    // the batch it was producing, if it was not idle
};

// No batch arrived within the loader's timeout.
class LoaderTimeoutError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Not a failure: adaptive streams (LoaderOptions::adaptive with round_robin)
// whose controller advised another count of processes while next() waited with
// no batch ready. next() stops waiting so that the front end starts its streams
// again on Loader::advised_processes() processes now, not after the batch in
// flight (a stream's first batch can take seconds); the loader is unchanged.
class ProcessesAdvised : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A worker reported that producing a batch failed. `payload` is whatever the
// worker wrote (the C++ API writes the exception text; the Python layer writes
// a pickled exception with its traceback); `kind` says which it is and what
// failed (FailureKind); `path` and `key` name the input (file, or shard and
// sample key) where the worker knew it.
class BatchFailedError : public std::runtime_error {
 public:
  BatchFailedError(const std::string& what, int worker_id, int pid, int64_t batch_id, std::string payload,
                   FailureKind kind = FailureKind::kOther, std::string path = {}, std::string key = {})
      : std::runtime_error(what),
        worker_id(worker_id),
        pid(pid),
        batch_id(batch_id),
        payload(std::move(payload)),
        kind(kind),
        path(std::move(path)),
        key(std::move(key)) {}
  int worker_id;
  int pid;
  int64_t batch_id;
  std::string payload;
  FailureKind kind;
  std::string path;
  std::string key;
};

// Input data is malformed: a corrupt or truncated tar shard, a .npy file with
// an unusable header, a label that is not a number. The message names the file
// (shard, key, byte offset) so the user can find and replace it; `path` and
// `key` hold the file (or shard) and the sample's key where known (empty: not
// known). Distinct from std::invalid_argument, which is for misuse of the API.
class DataError : public std::runtime_error {
 public:
  explicit DataError(const std::string& what, std::string path = {}, std::string key = {})
      : std::runtime_error(what), path(std::move(path)), key(std::move(key)) {}
  std::string path;
  std::string key;
};

// Encoded image bytes could not be decoded (truncated, corrupt, empty, not a
// JPEG/PNG, or over kMaxImagePixels). The message carries the decoder's own;
// `path` and `key` as for DataError.
class DecodeError : public std::runtime_error {
 public:
  explicit DecodeError(const std::string& what, std::string path = {}, std::string key = {})
      : std::runtime_error(what), path(std::move(path)), key(std::move(key)) {}
  std::string path;
  std::string key;
};

// A bug in spindle: a state the code believes cannot happen. Not the user's
// doing, so the message ends with the source location and asks for a report.
// A std::logic_error (as before it had a type of its own); in Python an
// AssertionError (spdl's InternalError).
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Samples a native pipeline skipped (on_error="skip") exceed its
// max_skip_ratio: carries the counts the loader judged.
class SkipRatioError : public DataError {
 public:
  SkipRatioError(const std::string& what, uint64_t skipped, uint64_t samples, double max_ratio)
      : DataError(what), skipped(skipped), samples(samples), max_ratio(max_ratio) {}
  uint64_t skipped;
  uint64_t samples;
  double max_ratio;
};

namespace detail {
std::string location_suffix(const char* file, int line);
}  // namespace detail

}  // namespace spindle

// Throws `Type(message)`: a user-facing error, no source location.
#define SPINDLE_THROW(Type, message) throw Type(std::string(message))

// Throws std::system_error for the current errno with a message.
#define SPINDLE_THROW_ERRNO(message) \
  throw std::system_error(errno, std::generic_category(), std::string(message))

// Throws InternalError: "<message> (bug in spindle, please report it) [file:line]".
#define SPINDLE_FAIL_INTERNAL(message)                                               \
  throw ::spindle::InternalError(std::string(message) +                              \
                                 " (bug in spindle, please report it)" +             \
                                 ::spindle::detail::location_suffix(__FILE__, __LINE__))
