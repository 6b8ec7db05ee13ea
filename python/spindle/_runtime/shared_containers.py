"""``spindle.shared``: lists, tuples and dicts of plain values stored once, in shared memory.

A forked worker that merely *reads* a Python list of 3M paths copies it page by page: every
read writes the object's reference count. Stored here as one flat buffer plus offsets (as
detectron2's serialized list), the data has no Python objects to count: each worker maps the
same pages and builds only the item it reads. Spawned workers get the segment's descriptor,
not its bytes; nothing is ever named in /dev/shm for longer than the segment's creation
(``ShmSegment``: unlinked at once, freed when the last process that maps it lets go).

Segment layout (every number little-endian uint64; written once by the consumer, then sealed
read-only by ``SharedSegment.seal()``)::

    [0, 8)     magic  b"SPSHARE1"
    [8, 16)    container: 0 list, 1 tuple, 2 dict
    [16, 24)   n: items (dict: entries)
    [24, 32)   dict: key lookup: 0 none, 1 the key column's bytes, 2 the canonical column
    [32, 128)  three columns (values, keys, canonical keys), each four numbers:
               encoding (0 pickle, 1 utf-8 str, 2 bytes), offsets position, data position,
               data length
    [128, 136) dict: position of the lookup permutation (n numbers: entries in key-byte order)
    ...        each column: n + 1 offsets into its data (item i is data[off[i]:off[i+1]]), its data

A forked worker can also read the consumer's own list or tuple in place (``SharedList.inherited``,
what ``share="auto"`` does for workers that fork): each read copies the item out through borrowed
pointers (``_core.inherited_item``), writing nothing of the original, so its pages stay shared with no
segment at all. Spawned workers need the segment: they inherit nothing.

Plain values: exactly ``str``, ``bytes``, ``int``, ``float``, ``bool``, ``None`` and lists,
tuples, dicts, sets and frozensets of them (subclasses refused: an ``OrderedDict`` or a
``numpy.str_`` would come back as another type). Items decode to equal values, new objects on
every read.
"""

from __future__ import annotations

import os
import pickle
from functools import partial
import struct
from collections.abc import ItemsView, Iterator, KeysView, Mapping, Sequence, ValuesView
from itertools import accumulate, repeat
from typing import Any, Optional

from .. import _core

__all__ = ["SharedList", "SharedDict", "shared", "is_shared"]

_MAGIC = b"SPSHARE1"
_HEADER = struct.Struct("<8sQQQ" + "QQQQ" * 3 + "Q")
_HEADER_BYTES = 256  # room to grow; sections start 8-aligned after it
_LIST, _TUPLE, _DICT = 0, 1, 2
_PICKLE, _UTF8, _BYTES = 0, 1, 2
_NO_LOOKUP, _KEY_BYTES, _CANONICAL = 0, 1, 2
_CHUNK = 1 << 16  # items encoded per step: bounds the transient memory of building


class _NotPlain(TypeError):
    """An item holds something that is not a plain value."""


class _PlainPickler(pickle.Pickler):
    """pickle, refusing all but plain values: reducer_override runs for every object except
    exact None, bool, int, float, str, bytes, list, tuple, dict, set and frozenset."""

    def reducer_override(self, obj: Any) -> Any:
        raise _NotPlain(f"{type(obj).__module__}.{type(obj).__qualname__}")


def _encoding_of(items: Sequence[Any]) -> int:
    types = set(map(type, items))
    if types == {str}:
        return _UTF8
    if types == {bytes}:
        return _BYTES
    return _PICKLE


class _Discard:
    """A file that keeps nothing: where a chunk is pickled once only to check that it is plain."""

    def write(self, data: Any) -> int:
        return len(data)


def _pickled(chunk: Sequence[Any], start: int, what: str) -> list[bytes]:
    """Each item of `chunk` pickled on its own; TypeError naming the first that is not plain."""
    try:
        _PlainPickler(_Discard(), pickle.HIGHEST_PROTOCOL).dump(chunk)  # the whole chunk checked at C speed
    except (_NotPlain, RecursionError):
        for i, x in enumerate(chunk):  # find which item, for the message
            try:
                _PlainPickler(_Discard(), pickle.HIGHEST_PROTOCOL).dump(x)
            except _NotPlain as exc:
                raise TypeError(
                    f"spindle.shared: {what} {start + i} holds a {exc}, not a plain value (str, bytes, int, float, "
                    "bool, None, and lists, tuples, dicts of them); keep such data as it is or store arrays in "
                    "numpy") from None
            except RecursionError:
                raise TypeError(f"spindle.shared: {what} {start + i} is nested too deeply to store") from None
        raise
    return list(map(pickle.dumps, chunk, repeat(pickle.HIGHEST_PROTOCOL)))


class _Column:
    """One column: measured in a first pass (sizes only, plainness checked), then encoded a chunk at a
    time straight into the segment, so building never holds the whole encoded data besides it."""

    def __init__(self, items: Sequence[Any], what: str, encoding: Optional[int] = None) -> None:
        self.items, self.what = items, what
        self.encoding = _encoding_of(items) if encoding is None else encoding
        self.n = len(items)
        self.data_len = sum(len(data) for _, data in self._chunks())

    def _chunks(self) -> Iterator[tuple[list[int], bytes]]:
        """(item lengths, their encoded bytes) of each chunk, in order."""
        items = self.items
        for start in range(0, len(items), _CHUNK):
            chunk = items[start:start + _CHUNK]
            if self.encoding == _UTF8:
                joined = "".join(chunk)
                if joined.isascii():  # one byte a character: the lengths are the str lengths
                    yield list(map(len, chunk)), joined.encode("ascii")
                    continue
                parts = list(map(str.encode, chunk, repeat("utf-8"), repeat("surrogatepass")))
            elif self.encoding == _BYTES:
                parts = list(chunk)
            else:
                parts = _pickled(chunk, start, self.what)
            yield list(map(len, parts)), b"".join(parts)

    def nbytes(self) -> int:
        return 8 * (self.n + 1) + self.data_len

    def write(self, offsets: memoryview, data: memoryview) -> None:
        """Encodes the items into `offsets` (n + 1 uint64) and `data` (data_len bytes)."""
        from array import array

        offsets[0] = pos = 0
        i = 0
        for lengths, encoded in self._chunks():
            end = pos + len(encoded)
            if end > self.data_len or i + len(lengths) > self.n:
                break
            data[pos:end] = encoded
            ends = accumulate(lengths, initial=pos)
            next(ends)  # the chunk's own start, already written
            offsets[i + 1:i + 1 + len(lengths)] = array("Q", ends)
            i, pos = i + len(lengths), end
        if (i, pos) != (self.n, self.data_len):
            raise RuntimeError(f"spindle.shared: the {type(self.items).__name__} changed while it was being "
                               "stored (another thread?); share it when nothing changes it")


def _canonical(key: Any) -> bytes:
    """Bytes equal for keys that are equal as dict keys (1, 1.0 and True are one key),
    whatever objects make them up; TypeError for an unhashable or non-plain key."""
    t = type(key)
    if t is str:
        b = key.encode("utf-8", "surrogatepass")
        return b"s%d:" % len(b) + b
    if t is bool or t is int:
        return b"i%d;" % key
    if t is float:
        if key.is_integer():
            return b"i%d;" % int(key)
        return b"f" + key.hex().encode() + b";"
    if t is bytes:
        return b"b%d:" % len(key) + key
    if key is None:
        return b"n"
    if t is tuple:
        return b"t%d(" % len(key) + b"".join(_canonical(k) for k in key)
    if t is frozenset:
        return b"z%d(" % len(key) + b"".join(sorted(_canonical(k) for k in key))
    raise TypeError(f"spindle.shared: a dict key of type {t.__qualname__} is not a plain value")


class _Store:
    """A parsed segment: its buffer and each column as (encoding, offsets, data) views."""

    def __init__(self, segment: Any) -> None:
        self.segment = segment  # SharedSegment (the maker) or SegmentView (others): keeps the mapping
        self.view = memoryview(segment)
        (magic, self.container, self.n, self.lookup, *cols, self.perm_at) = _HEADER.unpack_from(self.view)
        if magic != _MAGIC:
            raise ValueError("spindle.shared: the segment handed over is not a shared container (bad magic)")
        self.columns = []
        for c in range(3):
            encoding, off_at, data_at, data_len = cols[4 * c:4 * c + 4]
            if off_at == 0:
                self.columns.append(None)
                continue
            offsets = self.view[off_at:off_at + 8 * (self.n + 1)].cast("Q")
            self.columns.append((encoding, offsets, self.view[data_at:data_at + data_len]))
        self.perm = self.view[self.perm_at:self.perm_at + 8 * self.n].cast("Q") if self.perm_at else None

    @classmethod
    def build(cls, container: int, columns: list[Optional[_Column]], lookup: int = _NO_LOOKUP,
              perm: Optional[Any] = None, what: str = "spindle.shared") -> "_Store":
        n = columns[0].n if columns[0] is not None else 0
        pos = _HEADER_BYTES
        fields: list[int] = []
        for col in columns:
            if col is None:
                fields += [0, 0, 0, 0]
                continue
            off_at = pos
            data_at = off_at + 8 * (col.n + 1)
            fields += [col.encoding, off_at, data_at, col.data_len]
            pos = (data_at + col.data_len + 7) & ~7
        perm_at = 0
        if perm is not None:
            perm_at, pos = pos, pos + 8 * len(perm)
        segment = _core.SharedSegment(max(pos, _HEADER_BYTES), what)
        out = memoryview(segment)
        try:
            _HEADER.pack_into(out, 0, _MAGIC, container, n, lookup, *fields, perm_at)
            for c, col in enumerate(columns):
                if col is None:
                    continue
                _, off_at, data_at, data_len = fields[4 * c:4 * c + 4]
                with out[off_at:data_at].cast("Q") as offsets, out[data_at:data_at + data_len] as data:
                    col.write(offsets, data)
            if perm is not None:
                out[perm_at:perm_at + 8 * len(perm)] = memoryview(perm).cast("B")
        finally:
            out.release()
        segment.seal()
        return cls(segment)

    def decoder(self, column: int) -> Any:
        """item -> its value in `column` (a closure over the column's views: one call per read)."""
        encoding, offsets, data = self.columns[column]
        if encoding == _UTF8:
            def decode(i: int, offsets: Any = offsets, data: Any = data) -> Any:
                return str(data[offsets[i]:offsets[i + 1]], "utf-8", "surrogatepass")
        elif encoding == _BYTES:
            def decode(i: int, offsets: Any = offsets, data: Any = data) -> Any:
                return bytes(data[offsets[i]:offsets[i + 1]])
        else:
            def decode(i: int, offsets: Any = offsets, data: Any = data, loads: Any = pickle.loads) -> Any:
                return loads(data[offsets[i]:offsets[i + 1]])
        return decode

    def raw(self, column: int, i: int) -> bytes:
        _, offsets, data = self.columns[column]
        return bytes(data[offsets[i]:offsets[i + 1]])

    def fd(self) -> int:
        return self.segment.fd

    def nbytes(self) -> int:
        return len(self.view)


# ------------------------------------------------------------------ pickling: the handle, never the data

def _handle(store: _Store) -> tuple:
    """What a pickled container carries: a descriptor handed over to a spawned child (multiprocessing's
    or spindle's spawning context), else where to reopen it: /proc/<pid>/fd/<fd> of this process,
    with the inode that proves it is still the same segment."""
    from multiprocessing import context, reduction

    fd = store.fd()
    if context.get_spawning_popen() is not None:
        return ("fd", reduction.DupFd(fd))
    st = os.fstat(fd)
    return ("proc", os.getpid(), fd, st.st_dev, st.st_ino)


def _attach(handle: tuple) -> _Store:
    if handle[0] == "fd":
        fd = handle[1].detach()
        try:
            return _Store(_core.SegmentView(fd))
        finally:
            os.close(fd)
    _, pid, fd, dev, ino = handle
    try:
        mine = _core.open_process_fd(pid, fd)
    except OSError as exc:
        raise RuntimeError(
            f"spindle.shared: cannot open a shared container of process {pid} (descriptor {fd}): "
            f"{os.strerror(exc.errno) if exc.errno else exc}. "
            "A container pickled outside a spawning context is a handle to the process that made it, which "
            "must still hold it; send the original data, or start the receiver with multiprocessing's spawn "
            "or forkserver") from None
    try:
        st = os.fstat(mine)
        if (st.st_dev, st.st_ino) != (dev, ino):
            raise RuntimeError(f"spindle.shared: process {pid} no longer holds the shared container it pickled "
                               f"(descriptor {fd} is another file now); it was released before being unpickled")
        return _Store(_core.SegmentView(mine))
    finally:
        os.close(mine)


class _Inherited:
    """The store of a SharedList that reads a list or tuple this process inherited by fork, in place."""

    columns = (None, None, None)

    def __init__(self, items: Any) -> None:
        self.items, self.n = items, len(items)
        self.container = _TUPLE if type(items) is tuple else _LIST

    def decoder(self, column: int) -> Any:
        return partial(_core.inherited_item, self.items)

    def nbytes(self) -> int:
        return 0


def _inherited(items: Any, origin: Optional[str]) -> Any:
    obj = SharedList.__new__(SharedList)
    obj._bind(_Inherited(items), origin)
    return obj


def _rebuild(cls: type, handle: tuple, origin: Optional[str]) -> Any:
    obj = cls.__new__(cls)
    obj._bind(_attach(handle), origin)
    return obj


# ------------------------------------------------------------------ the containers

def _read_only(self: Any, *args: Any, **kwargs: Any) -> None:
    """Raises TypeError: the container is read-only (stored once for every worker)."""
    where = f" (spindle converted {self._origin} for the workers; pass share=\"off\" to the loader to keep " \
            "your own object)" if self._origin else ""
    raise TypeError(f"'{type(self).__name__}' is read-only: it is stored once in shared memory for every "
                    f"worker{where}. Copy it first (list(x), dict(x)) to change it")


class _SharedBase:
    _store: _Store
    _origin: Optional[str]  # the dataset attribute it was converted from (share="auto"), for errors

    def _bind(self, store: _Store, origin: Optional[str]) -> None:
        self._store, self._origin, self._n = store, origin, store.n
        self._value = store.decoder(0)
        if store.columns[1] is not None:
            self._key = store.decoder(1)

    def __reduce__(self) -> tuple:
        if isinstance(self._store, _Inherited):  # pickled (a spawned process): it carries the items
            return (_inherited, (self._store.items, self._origin))
        return (_rebuild, (type(self), _handle(self._store), self._origin))

    def __copy__(self) -> Any:
        return self  # read-only: one object is as good as a copy

    def __deepcopy__(self, memo: dict) -> Any:
        return self

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory it takes (header, offsets and data; 0 read in place, ``inherited``)."""
        return self._store.nbytes()

    __setitem__ = __delitem__ = _read_only


class SharedList(_SharedBase, Sequence):
    """A read-only list (or tuple) of plain values stored once in shared memory (``spindle.shared``).

    Indexing, ``len``, iteration, ``in``, ``index``, ``count`` and ``reversed`` behave as on the
    original; a slice returns a new ``list`` (``tuple`` if the original was one); it compares equal
    to an equal list (tuple). Items are decoded on each read: equal to the originals, not the same
    objects. Mutation raises TypeError. It is not an instance of ``list``. Pickled, it carries a handle
    to its segment, never the data."""

    def __init__(self, items: Any = ()) -> None:
        if isinstance(items, SharedList):
            self._bind(items._store, items._origin)
            return
        if not isinstance(items, (list, tuple)):
            items = list(items)
        container = _TUPLE if type(items) is tuple else _LIST
        self._bind(_Store.build(container, [_Column(items, "item"), None, None]), None)

    @classmethod
    def inherited(cls, items: Any) -> "SharedList":
        """A SharedList over `items` itself (a list or tuple of plain values, ``_core.plain_values``), for
        processes forked after it is made: each read copies the item out without writing the original,
        whose pages then stay shared. No segment is made; `items` must not change while it is read."""
        if type(items) not in (list, tuple) or not _core.plain_values(items):
            raise TypeError("spindle: SharedList.inherited takes a list or tuple of plain values")
        return _inherited(items, None)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        n = self._n
        if type(index) is int and 0 <= index < n:  # the common case first
            return self._value(index)
        if isinstance(index, slice):
            out = list(map(self._value, range(*index.indices(n))))
            return tuple(out) if self._store.container == _TUPLE else out
        try:
            i = index.__index__()
        except AttributeError:
            kind = "tuple" if self._store.container == _TUPLE else "list"
            raise TypeError(f"{kind} indices must be integers or slices, not {type(index).__name__}") from None
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{'tuple' if self._store.container == _TUPLE else 'list'} index out of range")
        return self._value(i)

    def __iter__(self) -> Iterator[Any]:
        return map(self._value, range(self._n))

    def __eq__(self, other: Any) -> bool:
        original = tuple if self._store.container == _TUPLE else list
        if isinstance(other, SharedList):
            if other._store.container != self._store.container:
                return False
        elif not isinstance(other, original):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        kind = "tuple" if self._store.container == _TUPLE else "list"
        return f"SharedList({kind}, {len(self)} items, {self.nbytes} bytes)"

    def __add__(self, other: Any) -> Any:
        return self[:] + other

    def __radd__(self, other: Any) -> Any:
        return other + self[:]

    def __mul__(self, k: int) -> Any:
        return self[:] * k

    __rmul__ = __mul__
    __iadd__ = __imul__ = append = extend = insert = pop = remove = clear = sort = reverse = _read_only


class _Items(ItemsView):
    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        d = self._mapping
        return zip(map(d._key, range(d._n)), map(d._value, range(d._n)))


class _Values(ValuesView):
    def __iter__(self) -> Iterator[Any]:
        d = self._mapping
        return map(d._value, range(d._n))


class SharedDict(_SharedBase, Mapping):
    """A read-only dict of plain keys and values stored once in shared memory (``spindle.shared``).

    ``d[k]``, ``get``, ``in``, ``len``, iteration (insertion order), ``keys``/``values``/``items`` and
    equality behave as on the original dict; a lookup is a binary search over the keys' bytes (no
    per-worker index is built). Values are decoded on each read. Mutation raises TypeError. It is not an
    instance of ``dict``. Pickled, it carries a handle to its segment, never the data."""

    def __init__(self, mapping: Any = ()) -> None:
        if isinstance(mapping, SharedDict):
            self._bind(mapping._store, mapping._origin)
            return
        if type(mapping) is not dict:
            mapping = dict(mapping)
        keys = list(mapping)
        values = _Column(list(mapping.values()), "the value of entry")
        key_col = _Column(keys, "key")
        from array import array

        if key_col.encoding == _UTF8:  # str keys: their utf-8 bytes are the lookup order
            lookup, canon = _KEY_BYTES, None
            order_of = list(map(str.encode, keys, repeat("utf-8"), repeat("surrogatepass")))
        else:
            order_of = [_canonical(k) for k in keys]
            lookup, canon = _CANONICAL, _Column(order_of, "key", encoding=_BYTES)
        perm = array("Q", sorted(range(len(keys)), key=order_of.__getitem__))
        del order_of
        self._bind(_Store.build(_DICT, [values, key_col, canon], lookup, perm), None)

    def _find(self, key: Any) -> int:
        """The entry of `key`, or -1."""
        store = self._store
        if store.lookup == _KEY_BYTES:
            if not isinstance(key, str):
                return -1
            probe = key.encode("utf-8", "surrogatepass")
            column = 1
        else:
            try:
                probe = _canonical(key)
            except TypeError:
                hash(key)  # an unhashable key raises TypeError, as dict does
                return -1
            column = 2
        perm = store.perm
        lo, hi = 0, store.n
        while lo < hi:
            mid = (lo + hi) // 2
            if store.raw(column, perm[mid]) < probe:
                lo = mid + 1
            else:
                hi = mid
        if lo < store.n and store.raw(column, perm[lo]) == probe:
            return perm[lo]
        return -1

    def __getitem__(self, key: Any) -> Any:
        i = self._find(key)
        if i < 0:
            raise KeyError(key)
        return self._value(i)

    def __contains__(self, key: Any) -> bool:
        return self._find(key) >= 0

    def get(self, key: Any, default: Any = None) -> Any:
        i = self._find(key)
        return default if i < 0 else self._value(i)

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Any]:
        return map(self._key, range(self._n))

    def keys(self) -> KeysView:
        return KeysView(self)

    def items(self) -> ItemsView:
        return _Items(self)

    def values(self) -> ValuesView:
        return _Values(self)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, (dict, SharedDict)):
            return NotImplemented
        return len(self) == len(other) and all(k in other and other[k] == v for k, v in self.items())

    __hash__ = None  # type: ignore[assignment]

    def __or__(self, other: Any) -> dict:
        return dict(self) | other

    def __ror__(self, other: Any) -> dict:
        return other | dict(self)

    __ior__ = pop = popitem = clear = update = setdefault = _read_only

    def copy(self) -> dict:
        """A plain dict with the same entries (as dict.copy)."""
        return dict(self.items())

    def __repr__(self) -> str:
        return f"SharedDict({len(self)} entries, {self.nbytes} bytes)"


def shared(obj: Any) -> Any:
    """``obj`` stored once in shared memory, for every worker to read without copying it.

    A list or tuple becomes a :class:`SharedList`, a dict a :class:`SharedDict`; their items must be
    plain values (``str``, ``bytes``, ``int``, ``float``, ``bool``, ``None`` and lists, tuples, dicts,
    sets of them; TypeError naming the first item that is not). An object already shared is returned
    as it is. The result is read-only; reads decode equal values. Forked workers see the same pages;
    spawned ones are handed the segment's descriptor when it is pickled. The memory is released when
    the last process holding it drops it; nothing is left in /dev/shm, however a process ends."""
    if isinstance(obj, (SharedList, SharedDict)):
        return obj
    if type(obj) in (list, tuple):
        return SharedList(obj)
    if type(obj) is dict:
        return SharedDict(obj)
    raise TypeError(f"spindle.shared takes a list, tuple or dict of plain values, not {type(obj).__qualname__}")


def is_shared(obj: Any) -> bool:
    """Whether obj is one of spindle.shared's containers."""
    return isinstance(obj, (SharedList, SharedDict))
