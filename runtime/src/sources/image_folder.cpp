// ImageFolder: torchvision.datasets.ImageFolder's class and file order, read
// with one open/pread/close per sample (see sources.hpp for why no fd is kept).
#include <spindle/sources.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "io_util.hpp"

namespace spindle {
namespace {

constexpr const char* kExtensionList = ".jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp";

bool is_image_name(const std::string& name) {
  // torchvision.datasets.folder.IMG_EXTENSIONS, with its case-insensitive
  // suffix test (has_file_allowed_extension): every one is decoded
  // (spindle/ops/image_ops.hpp), so the sample indices are torchvision's.
  static const char* const kExtensions[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp",
                                            ".pgm", ".tif", ".tiff", ".webp"};
  for (const char* ext : kExtensions) {
    const std::size_t n = std::strlen(ext);
    if (name.size() < n) continue;
    bool match = true;
    for (std::size_t k = 0; k < n && match; ++k) {
      char c = name[name.size() - n + k];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      match = c == ext[k];
    }
    if (match) return true;
  }
  return false;
}

bool is_dir_following_links(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Entries of `dir` other than . and .., split into (directories, other files),
// following symlinks like os.scandir's is_dir() and os.walk(followlinks=True).
void list_dir(const std::string& dir, std::vector<std::string>& dirs, std::vector<std::string>& files) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) SPINDLE_THROW_ERRNO("ImageFolder: cannot list directory '" + dir + "'");
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    bool is_dir;
    if (e->d_type == DT_DIR) is_dir = true;
    else if (e->d_type == DT_REG) is_dir = false;
    else is_dir = is_dir_following_links(dir + "/" + name);  // symlink or unknown type
    (is_dir ? dirs : files).push_back(name);
  }
  ::closedir(d);
}

// os.walk(top, followlinks=True) yields (dirpath, files) for every directory;
// torchvision sorts those tuples, i.e. by dirpath, then each file list.
void walk(const std::string& top, int depth, std::vector<std::pair<std::string, std::vector<std::string>>>& out) {
  // os.walk would recurse forever through a symlink loop; we stop with a clear error.
  if (depth > 64) throw DataError("ImageFolder: directories nested over 64 deep at '" + top + "' (a symlink loop?)");
  std::vector<std::string> dirs, files;
  list_dir(top, dirs, files);
  out.emplace_back(top, std::move(files));
  for (const std::string& d : dirs) walk(top + "/" + d, depth + 1, out);
}

}  // namespace

ImageFolder::ImageFolder(std::string root) : root_(std::move(root)) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  struct stat st;
  if (::stat(root_.c_str(), &st) != 0) SPINDLE_THROW_ERRNO("ImageFolder: cannot open root '" + root_ + "'");
  if (!S_ISDIR(st.st_mode)) {
    errno = ENOTDIR;
    SPINDLE_THROW_ERRNO("ImageFolder: root '" + root_ + "' is not a directory");
  }
  std::vector<std::string> files;
  list_dir(root_, classes_, files);
  std::sort(classes_.begin(), classes_.end());  // bytewise == Python's code-point order for UTF-8
  if (classes_.empty())
    throw DataError("ImageFolder: no class folder in '" + root_ +
                    "'; expected the ImageNet layout root/<class>/<image>");
  if (classes_.size() > static_cast<std::size_t>(INT32_MAX)) throw DataError("ImageFolder: too many classes");
  std::vector<std::string> empty;
  for (std::size_t c = 0; c < classes_.size(); ++c) {
    std::vector<std::pair<std::string, std::vector<std::string>>> dirs;
    walk(root_ + "/" + classes_[c], 0, dirs);
    std::sort(dirs.begin(), dirs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const std::size_t before = paths_.size();
    for (auto& [dir, names] : dirs) {
      std::sort(names.begin(), names.end());
      for (const std::string& n : names) {
        if (!is_image_name(n)) continue;
        paths_.push_back(dir + "/" + n);
        labels_.push_back(static_cast<int32_t>(c));
      }
    }
    if (paths_.size() == before) empty.push_back(classes_[c]);
  }
  if (!empty.empty()) {
    std::string names;
    for (std::size_t k = 0; k < empty.size() && k < 10; ++k) names += (k ? ", " : "") + empty[k];
    if (empty.size() > 10) names += ", ... (" + std::to_string(empty.size()) + " in all)";
    throw DataError("ImageFolder: no image file (" + std::string(kExtensionList) + ") in class folder(s) " + names + " of '" + root_ +
                    "'; remove the folder or add images");
  }
}

const std::string& ImageFolder::path(std::size_t i) const {
  if (i >= paths_.size())
    throw std::out_of_range("ImageFolder: index " + std::to_string(i) + " out of range for " +
                            std::to_string(paths_.size()) + " samples in '" + root_ + "'");
  return paths_[i];
}

int64_t ImageFolder::label(std::size_t i) const {
  path(i);  // range check
  return labels_[i];
}

Record ImageFolder::read(std::size_t i) const {
  const std::string& p = path(i);
  Record r;
  r.label = labels_[i];
  r.origin = p;
  r.data = detail::read_whole_file(p);
  return r;
}

}  // namespace spindle
