// A small .npy of RGB images for the examples to read when no image folder is
// given (the pipeline stage tests read it too). Header-only, standard C++ and
// POSIX: an example stays one file to build plus this header beside it.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace spindle_examples {

// Writes a .npy (format 1.0) of n images [n, h, w, 3] uint8 to `path`, with a
// pattern per image: pixel (i, y, x) is (i * step[0], y * step[1], x * step[2])
// modulo 256. Returns whether the file was written.
inline bool write_npy_images(const std::string& path, int n, int h, int w, const int (&step)[3]) {
  std::string header = "{'descr': '|u1', 'fortran_order': False, 'shape': (" + std::to_string(n) + ", " +
                       std::to_string(h) + ", " + std::to_string(w) + ", 3), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';  // the data starts 64-byte aligned
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());  // little-endian
  f.put(static_cast<char>(len & 0xff));
  f.put(static_cast<char>(len >> 8));
  f << header;
  for (int i = 0; i < n; ++i)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        const char px[3] = {static_cast<char>(i * step[0]), static_cast<char>(y * step[1]),
                            static_cast<char>(x * step[2])};
        f.write(px, 3);
      }
  return static_cast<bool>(f.flush());
}

// The same in a new file /tmp/<name>-XXXXXX.npy: its path, or "" if it could not be made.
inline std::string write_temp_npy_images(const std::string& name, int n, int h, int w, const int (&step)[3]) {
  std::string path = "/tmp/" + name + "-XXXXXX.npy";
  const int fd = mkstemps(path.data(), 4);
  if (fd < 0) return "";
  close(fd);
  return write_npy_images(path, n, h, w, step) ? path : "";
}

}  // namespace spindle_examples
