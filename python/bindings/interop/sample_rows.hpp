#pragma once
// SampleRows: a batch's samples (Python objects) as the rows that
// WorkerContext::put_rows copies into the slot.
//
// One SampleRows is compiled per batch structure (the nested dict/tuple/list
// walk and the fields' dtypes and shapes, as spindle/_runtime/layout.py worked them
// out from a batch's first sample), then reused for every batch of that
// structure: the walk over each sample is C++, with no Python call per sample
// or per field. It takes only samples the general Python path would write
// with the same bytes, and says "no" to anything else (a sample of another
// structure, a non-contiguous array, a leaf of another type); _runtime/layout.py then
// takes the batch and names the sample that differs. So this is a shortcut,
// never a second set of rules.

#include <pybind11/pybind11.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <spindle/slot_layout.hpp>

namespace spindle::python {

class SampleRows {
 public:
  // `walk`: the structure in preorder, one tuple per node, as _runtime/layout.py
  // compiles it: ("leaf",), ("seq", cls, n) (a tuple/list of type exactly
  // cls with n children), ("dict", keys) (a plain dict with exactly these
  // keys in this order). Leaves are fields 0, 1, ... in walk order.
  // `scalar_types[f]`: the numpy scalar type a 0-d field also accepts (None:
  // none). `structure`: the bytes the consumer gets with each batch.
  SampleRows(const pybind11::list& walk, SlotLayout layout, pybind11::bytes structure,
             const pybind11::list& scalar_types);

  // Rows (sample-major: rows[r * fields + f]) of `samples` into `out`, with
  // scalars converted into `scalars`, and a reference to every array (and a
  // buffer view of every numpy scalar) held until `out` is destroyed, so the
  // copy may run without the GIL. False if any sample is not one this walk
  // takes. Needs the GIL, also to destroy `out`.
  //
  // `kinds[r * fields + f]`: what the leaf was (a Leaf), so that a sample
  // already copied and let go can be rebuilt from its rows exactly as it
  // came (_runtime/layout.py, when a later sample of the batch does not match).
  enum class Leaf : uint8_t { kArray = 0, kInt = 1, kFloat = 2, kBool = 3, kNumpyScalar = 4 };
  struct Gathered {
    std::vector<const std::byte*> rows;
    std::vector<std::array<std::byte, 8>> scalars;
    std::vector<Leaf> kinds;
    std::vector<pybind11::object> arrays;
    std::vector<Py_buffer> views;
    bool hold_arrays = true;  // gather_one: the sample itself keeps them alive
    void release_views() noexcept;
    ~Gathered();
  };
  bool gather(const pybind11::list& samples, Gathered& out) const;
  // The same for one sample, whose rows are copied before it is let go (a
  // worker copying each sample as it reads it): rows[f] of field f, no array
  // references taken; the previous sample's views are released first.
  bool gather_one(PyObject* sample, Gathered& out) const;

  const SlotLayout& layout() const noexcept { return layout_; }
  std::string_view structure() const noexcept { return structure_; }

 private:
  struct Node {
    enum class Kind { kLeaf, kSequence, kDict } kind = Kind::kLeaf;
    pybind11::object cls;                // kSequence: the exact type
    std::vector<pybind11::object> keys;  // kDict, in order
    std::size_t size = 0;                // kSequence: children; kDict: keys
  };
  struct Field {
    pybind11::object descr;        // the dtype arrays must have
    std::vector<int64_t> shape;    // of one sample
    pybind11::object scalar_type;  // numpy scalar type a 0-d field takes (or None)
    bool takes_int = false;        // 0-d "<i8": a Python int
    bool takes_float = false;      // 0-d "<f8": a Python float
    bool takes_bool = false;       // 0-d "|b1": a Python bool
  };
  bool walk(PyObject* value, std::size_t& node, std::size_t& field, std::size_t sample, Gathered& out) const;
  bool leaf(PyObject* value, std::size_t f, std::size_t sample, Gathered& out) const;

  std::vector<Node> nodes_;
  std::vector<Field> fields_;
  std::size_t buffer_fields_ = 0;  // fields that may take a numpy scalar (a buffer view each)
  SlotLayout layout_;
  std::string structure_;
};

}  // namespace spindle::python
