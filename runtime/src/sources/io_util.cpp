#include "io_util.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <spindle/error.hpp>

namespace spindle::detail {

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

std::size_t pread_full(int fd, void* dst, std::size_t n, uint64_t offset, const std::string& name) {
  auto* p = static_cast<char*>(dst);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, p + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      SPINDLE_THROW_ERRNO("cannot read '" + name + "' at byte " + std::to_string(offset + got));
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

std::vector<std::byte> read_whole_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) SPINDLE_THROW_ERRNO("cannot open '" + path + "'");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) SPINDLE_THROW_ERRNO("cannot stat '" + path + "'");
  if (!S_ISREG(st.st_mode)) throw DataError("'" + path + "' is not a regular file");
  std::vector<std::byte> data(static_cast<std::size_t>(st.st_size));
  const std::size_t got = pread_full(fd.get(), data.data(), data.size(), 0, path);
  if (got != data.size())
    throw DataError("'" + path + "' shrank while being read (" + std::to_string(got) + " of " +
                    std::to_string(data.size()) + " bytes)");
  return data;
}

}  // namespace spindle::detail
