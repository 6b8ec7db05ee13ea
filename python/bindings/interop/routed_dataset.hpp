#pragma once
// RoutedDataset: a map-style dataset whose element i is element indices[i] of
// source sources[i] (spindle.mix's schedule). The worker's row reader
// (read_rows.cpp) recognizes one and reads element i as two array loads and
// the source's bound __getitem__, with no Python call of the mix's own per
// sample. The schedule stays the mix's: its two arrays are viewed through the
// buffer protocol (forked workers share the pages), never copied.
//
// It also owns what the mix says about an element: where it is (locate), the
// IndexError for an index out of range, and the note an exception from a
// source gets, naming the mix's index, the source and the source's index.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/pybind11.h>

namespace spindle::python {

class RoutedDataset {
 public:
  // `sources`: each element's source (1-D uint8 or uint32); `indices`: its
  // index there (1-D int32 or int64, as long); `getters[j]`: source j's bound
  // __getitem__; `names[j]`: how errors name source j ("datasets[1] (Tagged)");
  // `about`: what the IndexError adds ("sources of [..], weights [..]").
  // ValueError if the arrays are not such buffers or the lengths disagree.
  RoutedDataset(const pybind11::buffer& sources, const pybind11::buffer& indices, const pybind11::list& getters,
                std::vector<std::string> names, std::string about);

  std::size_t size() const noexcept { return size_; }

  // (source, index in it) of element i (negative: from the end); IndexError
  // naming i and the length if out of range.
  std::pair<uint32_t, int64_t> locate(int64_t i) const;

  // getters[source](index) of element i. An exception from the source
  // propagates with a note naming i, the source and its index.
  pybind11::object get(int64_t i) const;

  // The note get() adds to a source's exception for element i.
  std::string describe(int64_t i) const;

 private:
  pybind11::buffer_info sources_;  // holds the views: the arrays live as long as this
  pybind11::buffer_info indices_;
  std::size_t size_ = 0;
  std::vector<pybind11::object> getters_;
  std::vector<std::string> names_;
  std::string about_;
};

// The RoutedDataset `dataset` is, or nullptr (one type check: the readers ask
// once a batch).
const RoutedDataset* as_routed(pybind11::handle dataset);

}  // namespace spindle::python
