#pragma once
// Workers whose main is Python: a function run in a forked child, or a new
// program spawned from argv (a new interpreter: spindle.torch with spawn).
#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include <spindle/launcher.hpp>
#include <spindle/worker_context.hpp>

namespace spindle::python {
// The exit status sys.exit(code) asks for: None -> 0, an int -> it, anything
// else is printed to stderr -> 1 (Python's own rule).
int system_exit_code(const pybind11::object& exc);
// fn(ctx) in the forked child: its int result (None: 0) is the exit status;
// sys.exit(code) exits with code; any other exception is printed, status 1.
WorkerMain python_worker_main(pybind11::function fn);
// How a Loader built from Python starts its workers: spawned from
// `spawn_argv` in an environment with `spawn_env` set (nothing forked;
// worker_main unused), else forked running worker_main with the
// interpreter's fork protocol (the GIL stays held).
Launcher python_launcher(std::optional<pybind11::function> worker_main,
                         std::optional<std::vector<std::string>> spawn_argv, std::vector<int> spawn_fds,
                         std::vector<std::string> spawn_env);
}  // namespace spindle::python
