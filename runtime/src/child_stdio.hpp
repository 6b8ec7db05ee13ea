#pragma once
// stdio in a forked child. fork() copies the parent's unflushed stdio buffers
// (stdout is fully buffered when it is a file or a pipe), so a child that
// flushes them writes the parent's pending output a second time: a line a
// program printed before starting processes-mode workers appeared once per
// worker, plus once from the parent. Every fork in the runtime therefore drops
// what it inherited before running anything, and a child leaves with _exit
// after flushing only stdout and stderr, which by then hold its own output.
// Other FILE streams the child inherited are never flushed by it.
#include <stdio_ext.h>

#include <cstdio>

namespace spindle::detail {

// First thing in a forked child: forget the parent's pending stdout/stderr
// bytes (the parent still has them and writes them itself).
inline void drop_inherited_stdio() noexcept {
  __fpurge(stdout);
  __fpurge(stderr);
}

// Last thing before _exit in a forked child: what the child itself printed.
inline void flush_own_stdio() noexcept {
  std::fflush(stdout);
  std::fflush(stderr);
}

}  // namespace spindle::detail
