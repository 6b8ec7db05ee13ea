// GoogleTests of the data sources (runtime/include/spindle/sources.hpp):
// ImageFolder's torchvision order, ArraySource over .npy files, TarReader on
// well-formed and corrupt archives, WebDataset grouping and labels, reads from
// several threads and from a forked child. Archives are built byte by byte
// here (so corruption lands at known offsets) and, where GNU tar is installed,
// by `tar --format=ustar|gnu|pax`.
#include <spindle/sources.hpp>

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "tar_write.hpp"
#include "test_support.hpp"

using namespace spindle;
using spindle::testing::TempDir;
using spindle::testing::write_file;
using spindle::testing::pad;
using spindle::testing::tar_header;
using spindle::testing::tar_member;
using spindle::testing::kTarEnd;

namespace {

std::string to_string(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

std::string pax_record(const std::string& key, const std::string& value) {
  // "<len> key=value\n" where len counts itself.
  const std::string body = " " + key + "=" + value + "\n";
  std::size_t len = body.size() + 1;
  while (std::to_string(len).size() + body.size() != len) ++len;
  return std::to_string(len) + body;
}


// prefix + n + suffix (std::string operator+ here trips GCC 12's false -Wrestrict, PR 105329).
std::string numbered(const char* prefix, int n, const char* suffix) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%d%s", prefix, n, suffix);
  return buf;
}

std::vector<std::pair<std::string, std::string>> read_all(TarReader& r) {
  std::vector<std::pair<std::string, std::string>> out;
  while (auto m = r.next()) {
    EXPECT_EQ(m->size, m->data.size());
    out.emplace_back(m->name, to_string(m->data));
  }
  return out;
}

// The message of the DataError that `f` throws ("" if none).
template <class F>
std::string data_error_of(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

std::string npy_v1(const std::string& dict, const std::string& data) {
  std::string header = dict;
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + data;
}

}  // namespace

// Proves: classes are the sorted subfolders (class index = position), samples are every file below them
// with one of torchvision's IMG_EXTENSIONS (any case, nested folders too) in sorted(os.walk) then
// sorted(file) order, like torchvision's ImageFolder; other suffixes (.txt, .gif) are not samples.
TEST(ImageFolderTest, ClassIndexAndOrderFollowTorchvisionRule) {
  TempDir dir;
  const auto& r = dir.path();
  write_file(r / "dog" / "b.jpg", "dog-b");
  write_file(r / "dog" / "a.PNG", "dog-a");
  write_file(r / "dog" / "notes.txt", "skip");
  write_file(r / "dog" / "anim.gif", "not in IMG_EXTENSIONS");
  write_file(r / "dog" / "sub" / "c.jpeg", "dog-sub-c");
  write_file(r / "dog" / "sub-a" / "d.jpg", "dog-sub-a-d");
  write_file(r / "Cat" / "z.jpg", "cat-z");
  write_file(r / "ant" / "x.JPEG", "ant-x");
  for (const char* name : {"e.webp", "f.WebP", "g.bmp", "h.ppm", "i.pgm", "j.tif", "k.TIFF"})
    write_file(r / "eel" / name, name);
  write_file(r / "readme.jpg", "top-level files are no class");
  ImageFolder f(r.string());
  EXPECT_EQ(f.classes(), (std::vector<std::string>{"Cat", "ant", "dog", "eel"}));
  ASSERT_EQ(f.size(), 13u);
  const std::string root = r.string();
  const std::vector<std::pair<std::string, int64_t>> want = {
      {root + "/Cat/z.jpg", 0},      {root + "/ant/x.JPEG", 1},          {root + "/dog/a.PNG", 2},
      {root + "/dog/b.jpg", 2},      {root + "/dog/sub/c.jpeg", 2},      {root + "/dog/sub-a/d.jpg", 2},
      {root + "/eel/e.webp", 3},     {root + "/eel/f.WebP", 3},          {root + "/eel/g.bmp", 3},
      {root + "/eel/h.ppm", 3},      {root + "/eel/i.pgm", 3},           {root + "/eel/j.tif", 3},
      {root + "/eel/k.TIFF", 3}};
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(f.path(i), want[i].first) << i;
    EXPECT_EQ(f.label(i), want[i].second) << i;
  }
  const Record rec = f.read(4);
  EXPECT_EQ(to_string(rec.data), "dog-sub-c");
  EXPECT_EQ(rec.label, 2);
  EXPECT_EQ(rec.origin, root + "/dog/sub/c.jpeg");
  EXPECT_THROW(f.read(13), std::out_of_range);
}

// Proves: a class folder without images and a root without class folders are DataErrors naming them; a missing
// root is a std::system_error (Python: FileNotFoundError).
TEST(ImageFolderTest, EmptyClassOrMissingRootIsReported) {
  TempDir dir;
  write_file(dir.path() / "a" / "x.jpg", "x");
  std::filesystem::create_directories(dir.path() / "empty");
  const std::string msg = data_error_of([&] { ImageFolder f(dir.path().string()); });
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;
  TempDir none;
  EXPECT_NE(data_error_of([&] { ImageFolder f(none.path().string()); }).find("no class folder"), std::string::npos);
  EXPECT_THROW(ImageFolder((dir.path() / "missing").string()), std::system_error);
}

// Proves: an ImageFolder built and read in the parent reads correctly in a forked child (no shared fd offset).
TEST(ImageFolderTest, ReadInForkedChildAfterParent) {
  TempDir dir;
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 5; ++i)
      write_file(dir.path() / numbered("c", c, "") / numbered("", i, ".jpg"),
                 std::string(100 + i * 37 + c, static_cast<char>('a' + i)));
  ImageFolder f(dir.path().string());
  std::vector<std::string> parent;
  for (std::size_t i = 0; i < f.size(); ++i) parent.push_back(to_string(f.read(i).data));
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int bad = 0;
    for (std::size_t k = 0; k < f.size(); ++k) {
      const std::size_t i = f.size() - 1 - k;  // another order than the parent's
      const Record r = f.read(i);
      bad += to_string(r.data) != parent[i] || r.label != static_cast<int64_t>(i / 5);
    }
    _exit(bad == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(to_string(f.read(0).data), parent[0]);
}

// Proves: a .npy file is mapped and read row by row with its dtype and row shape; the in-memory form agrees.
TEST(ArraySourceTest, NpyRowsAndBuffer) {
  TempDir dir;
  std::vector<float> v(3 * 2 * 2);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f;
  const std::string data(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  write_bytes(dir.path() / "a.npy", npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2, 2), }", data));
  ArraySource a = ArraySource::from_npy((dir.path() / "a.npy").string());
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(a.dtype(), "<f4");
  EXPECT_EQ(a.row_shape(), (std::vector<int64_t>{2, 2}));
  for (std::size_t i = 0; i < 3; ++i) {
    auto row = a.row(i);
    ASSERT_EQ(row.size(), 16u);
    EXPECT_EQ(std::memcmp(row.data(), v.data() + 4 * i, 16), 0) << i;
  }
  EXPECT_THROW(a.row(3), std::out_of_range);
  ArraySource b(v.data(), "<f4", {6, 2});
  EXPECT_EQ(b.size(), 6u);
  EXPECT_EQ(b.row_bytes(), 8u);
  EXPECT_EQ(std::memcmp(b.row(5).data(), v.data() + 10, 8), 0);
  // An empty array and a 1-d array of bytes.
  write_bytes(dir.path() / "e.npy", npy_v1("{'descr': '|u1', 'fortran_order': False, 'shape': (0,), }", ""));
  EXPECT_EQ(ArraySource::from_npy((dir.path() / "e.npy").string()).size(), 0u);
}

// Proves: fortran order, object dtypes, 0-d arrays, short files and non-.npy files are refused with DataErrors
// that name the file and say what to change.
TEST(ArraySourceTest, UnusableNpyIsRefused) {
  TempDir dir;
  auto refuse = [&](const std::string& name, const std::string& bytes, const std::string& expect) {
    write_bytes(dir.path() / name, bytes);
    const std::string msg = data_error_of([&] { ArraySource::from_npy((dir.path() / name).string()); });
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
    EXPECT_NE(msg.find(expect), std::string::npos) << msg;
  };
  refuse("f.npy", npy_v1("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", std::string(16, '\0')),
         "Fortran-order");
  refuse("o.npy", npy_v1("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", std::string(16, '\0')),
         "cannot carry");
  refuse("s.npy", npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", std::string(4, '\0')), "0-d");
  refuse("t.npy", npy_v1("{'descr': '<f8', 'fortran_order': False, 'shape': (4,), }", std::string(31, '\0')),
         "truncated");
  refuse("r.npy", npy_v1("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,), }", ""), "structured");
  refuse("x.npy", "not numpy at all", "magic");
}

// Proves: regular members come back in order with their bytes (empty members too); directories are skipped; a
// ustar prefix, a GNU long name and pax path/size records give the member's full name and size.
TEST(TarReaderTest, UstarGnuAndPaxMembers) {
  TempDir dir;
  const std::string long_name = std::string(150, 'n') + "/0001.jpg";
  const std::string pax_name = std::string(120, 'p') + ".cls";
  std::string tar;
  tar += tar_member("d/", "", '5');
  tar += tar_member("0001.jpg", "JPEGDATA");
  tar += tar_member("0001.cls", "7");
  tar += tar_member("empty.txt", "");
  tar += tar_member("file.bin", "in a prefixed dir", '0', "some/prefix");
  tar += tar_member("././@LongLink", long_name + '\0', 'L') + tar_member(long_name.substr(0, 100), "long");
  tar += tar_member("PaxHeaders/x", pax_record("path", pax_name) + pax_record("size", "3"), 'x') +
         tar_header("ignored-short-name", 99) + pad("abc");
  tar += tar_member("link", "", '2');
  tar += kTarEnd;
  write_bytes(dir.path() / "a.tar", tar);
  TarReader r((dir.path() / "a.tar").string());
  const auto got = read_all(r);
  const std::vector<std::pair<std::string, std::string>> want = {
      {"0001.jpg", "JPEGDATA"}, {"0001.cls", "7"}, {"empty.txt", ""}, {"some/prefix/file.bin", "in a prefixed dir"},
      {long_name, "long"},      {pax_name, "abc"}};
  EXPECT_EQ(got, want);
  EXPECT_FALSE(r.next().has_value());
}

// Proves: corrupt shards (truncated mid-header, mid-data, between members; bad checksum; absurd or malformed size;
// oversized long name) throw DataError naming the shard and the byte offset of the damage, never reading past it.
TEST(TarReaderTest, CorruptShardsNameShardAndOffset) {
  TempDir dir;
  const std::string good = tar_member("a.jpg", std::string(700, 'x')) + tar_member("a.cls", "1") + kTarEnd;
  auto expect_error = [&](const std::string& name, const std::string& bytes, uint64_t offset,
                          const std::string& what) {
    const auto path = (dir.path() / name).string();
    write_bytes(path, bytes);
    const std::string msg = data_error_of([&] {
      TarReader r(path);
      while (r.next()) {
      }
    });
    EXPECT_NE(msg.find("'" + path + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("byte offset " + std::to_string(offset) + ":"), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  };
  // Member a.jpg: header at 0, data 512..1212, padded to 1536; a.cls header at 1536.
  expect_error("mid_header.tar", good.substr(0, 1536 + 300), 1536, "mid-header");
  expect_error("mid_data.tar", good.substr(0, 900), 0, "runs past the end");
  expect_error("between.tar", good.substr(0, 1536 + 1024), 2560, "end-of-archive");
  std::string bad_sum = good;
  bad_sum[1536 + 3] ^= 1;
  expect_error("checksum.tar", bad_sum, 1536, "checksum");
  expect_error("absurd.tar", tar_header("big", 0, '0', "", "77777777777") + kTarEnd, 0, "runs past the end");
  expect_error("notoctal.tar", tar_header("big", 0, '0', "", "12x4") + kTarEnd, 0, "size field");
  expect_error("longname.tar", tar_member("@LongLink", std::string(5000, 'a'), 'L') + kTarEnd, 0, "limit");
  expect_error("dangling_pax.tar", tar_member("x", pax_record("path", "a.jpg"), 'x') + kTarEnd, 0,
               "followed by the end");
  expect_error("garbage.tar", std::string(2048, 'g'), 0, "checksum");
}

// Proves: the reader works over a memfd (the fuzz target's path) and never moves the fd's own offset.
TEST(TarReaderTest, ReadsFromMemfdWithoutMovingItsOffset) {
  const std::string tar = tar_member("k.txt", "hello") + kTarEnd;
  const int fd = memfd_create("tar", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, tar.data(), tar.size()), static_cast<ssize_t>(tar.size()));
  ASSERT_EQ(lseek(fd, 7, SEEK_SET), 7);
  {
    TarReader r(fd, "memfd");
    const auto got = read_all(r);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].second, "hello");
  }
  EXPECT_EQ(lseek(fd, 0, SEEK_CUR), 7);
  close(fd);
}

// Proves: archives made by GNU tar in ustar, gnu and pax formats (with a >100-character name, an empty file and
// a directory) read back as the files that went in, in order.
TEST(TarReaderTest, GnuTarFormats) {
  if (std::system("tar --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "GNU tar not installed";
  TempDir dir;
  const std::string deep = "d/" + std::string(60, 'a') + "/" + std::string(60, 'b');  // > 100 chars with the file
  write_file(dir.path() / "src" / "0001.jpg", "jpg bytes");
  write_file(dir.path() / "src" / "0001.cls", "3");
  write_file(dir.path() / "src" / "empty.txt", "");
  write_file(dir.path() / "src" / deep / "0002.json", "{\"label\": 4}");
  for (const char* format : {"ustar", "gnu", "pax"}) {
    const auto out = (dir.path() / (std::string(format) + ".tar")).string();
    const std::string cmd = "cd " + (dir.path() / "src").string() + " && tar --format=" + format +
                            " --sort=name -cf " + out + " 0001.cls 0001.jpg empty.txt d";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    TarReader r(out);
    const auto got = read_all(r);
    const std::vector<std::pair<std::string, std::string>> want = {
        {"0001.cls", "3"}, {"0001.jpg", "jpg bytes"}, {"empty.txt", ""}, {deep + "/0002.json", "{\"label\": 4}"}};
    EXPECT_EQ(got, want) << format;
  }
}

// Proves: members are grouped into samples by webdataset's key rule (directory kept, basename up to the first
// dot; fields lower-cased), labels come from .cls or .json, and early stop works.
TEST(WebDatasetTest, GroupsByKeyAndReadsLabels) {
  TempDir dir;
  std::string tar = tar_member("__meta__", "skip") + tar_member("a/0001.jpg", "J1") + tar_member("a/0001.CLS", " 5\n") +
                    tar_member("a/0002.jpg", "J2") + tar_member("a/0002.seg.png", "P2") +
                    tar_member("a/0002.json", "{\"x\": [1, {\"label\": 9}], \"label\": -3}") +
                    tar_member("noext", "skipped") + tar_member("0003.jpg", "J3") + kTarEnd;
  write_bytes(dir.path() / "s.tar", tar);
  const std::string shard = (dir.path() / "s.tar").string();
  WebDataset ds({shard, shard});
  EXPECT_EQ(ds.num_shards(), 2u);
  EXPECT_EQ(ds.shards_of_worker(1, 2), (std::vector<std::size_t>{1}));
  std::vector<WdsSample> got;
  ds.for_each_in_shard(0, [&](WdsSample&& s) {
    got.push_back(std::move(s));
    return true;
  });
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].key, "a/0001");
  EXPECT_EQ(got[0].origin, shard + ":a/0001");
  EXPECT_EQ(to_string(got[0].fields.at("jpg")), "J1");
  EXPECT_EQ(WebDataset::label_of(got[0]), 5);
  EXPECT_EQ(got[1].fields.size(), 3u);
  EXPECT_EQ(to_string(got[1].fields.at("seg.png")), "P2");
  EXPECT_EQ(WebDataset::label_of(got[1]), -3);
  EXPECT_EQ(got[2].key, "0003");
  EXPECT_EQ(WebDataset::label_of(got[2]), -1);
  int seen = 0;
  ds.for_each_in_shard(1, [&](WdsSample&&) { return ++seen < 2; });
  EXPECT_EQ(seen, 2);

  WdsSample bad{"k", {{"cls", {std::byte{'x'}}}}, "s.tar:k"};
  EXPECT_NE(data_error_of([&] { WebDataset::label_of(bad); }).find("s.tar:k"), std::string::npos);
  WdsSample bad_json{"k", {{"json", {std::byte{'{'}}}}, "s.tar:k"};
  EXPECT_THROW(WebDataset::label_of(bad_json), DataError);

  std::string key, field;
  EXPECT_TRUE(WebDataset::split_key("x.y/0001.seg.PNG", key, field));
  EXPECT_EQ(key, "x.y/0001");
  EXPECT_EQ(field, "seg.png");
  EXPECT_FALSE(WebDataset::split_key(".hidden.jpg", key, field));
  EXPECT_FALSE(WebDataset::split_key("a/b.c/noext", key, field));
  EXPECT_TRUE(WebDataset::split_key("dir/.hidden.jpg", key, field));  // webdataset's regex backtracks to this
  EXPECT_EQ(key, "dir/");
  EXPECT_EQ(field, "hidden.jpg");
}

// Proves: a field repeated within one sample is a DataError naming shard, member and offset.
TEST(WebDatasetTest, DuplicateFieldIsDataError) {
  TempDir dir;
  write_bytes(dir.path() / "d.tar", tar_member("1.jpg", "a") + tar_member("1.jpg", "b") + kTarEnd);
  WebDataset ds({(dir.path() / "d.tar").string()});
  const std::string msg = data_error_of([&] { ds.for_each_in_shard(0, [](WdsSample&&) { return true; }); });
  EXPECT_NE(msg.find("d.tar"), std::string::npos) << msg;
  EXPECT_NE(msg.find("byte offset 1024"), std::string::npos) << msg;
}

// Proves: several threads reading the same ImageFolder, ArraySource and WebDataset shard at once all get the
// single-threaded answers (run under ThreadSanitizer).
TEST(SourcesConcurrency, ThreadsReadingTheSameSourcesAgree) {
  TempDir dir;
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 8; ++i)
      write_file(dir.path() / "img" / numbered("c", c, "") / numbered("", i, ".png"),
                 std::string(1000 + 13 * i + c, static_cast<char>('A' + c)));
  std::string tar;
  for (int i = 0; i < 50; ++i) {
    char key[16];
    std::snprintf(key, sizeof key, "%04d", i);
    tar += tar_member(std::string(key) + ".jpg", std::string(300 + i, static_cast<char>(i))) +
           tar_member(std::string(key) + ".cls", std::to_string(i % 10));
  }
  write_bytes(dir.path() / "s.tar", tar + kTarEnd);
  std::vector<int32_t> arr(1000);
  for (int i = 0; i < 1000; ++i) arr[i] = i * 7;

  const ImageFolder folder((dir.path() / "img").string());
  const WebDataset wds({(dir.path() / "s.tar").string()});
  const ArraySource rows(arr.data(), "<i4", {250, 4});
  auto snapshot = [&] {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < folder.size(); ++i) {
      const Record r = folder.read(i);
      out.push_back(r.origin + ":" + std::to_string(r.label) + ":" + to_string(r.data));
    }
    wds.for_each_in_shard(0, [&](WdsSample&& s) {
      out.push_back(s.key + ":" + std::to_string(WebDataset::label_of(s)) + ":" + to_string(s.fields.at("jpg")));
      return true;
    });
    for (std::size_t i = 0; i < rows.size(); ++i) {
      auto r = rows.row(i);
      out.emplace_back(reinterpret_cast<const char*>(r.data()), r.size());
    }
    return out;
  };
  const auto want = snapshot();
  std::vector<std::vector<std::string>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { got[t] = snapshot(); });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(got[t], want) << "thread " << t;
}
