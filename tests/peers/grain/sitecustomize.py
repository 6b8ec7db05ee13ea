"""Runs grain's own test suite with spindle in place of grain's multi-process stages.

With this folder on PYTHONPATH and SPINDLE_PEER_PATCH=grain, every interpreter
(pytest and any process it starts) replaces, after importing grain:

- ``grain.DataLoader`` (and the same class under grain.python and
  grain._src.python.data_loader) with ``spindle.grain.DataLoader``, the usual
  monkeypatch a user would write;
- ``process_prefetch.multiprocess_prefetch``, which ``IterDataset.mp_prefetch``
  and grain's tests call, with ``spindle.grain.mp_prefetch``; before grain 0.2.17,
  ``IterDataset.mp_prefetch`` itself, and the stage class its tests build
  (``prefetch.MultiprocessPrefetchIterDataset``) with the one spindle.grain's
  mp_prefetch builds there.

With SPINDLE_PEER_PATCH=grain or =off (the baseline, grain unpatched), absl
flags are marked parsed first, as ``absltest.main`` does for grain's own runs:
grain's multi-process code reads them.

Used by ``make peer-grain``; grain's test files stay in its wheel.
"""

import os

if os.environ.get("SPINDLE_PEER_PATCH") in ("grain", "off"):
    from absl import flags

    flags.FLAGS.mark_as_parsed()

if os.environ.get("SPINDLE_PEER_PATCH") == "grain":
    import grain
    import grain.python
    from grain._src.python import data_loader as _data_loader

    import spindle.grain

    try:
        from grain._src.python.dataset.transformations import process_prefetch as _process_prefetch
    except ImportError:  # grain before 0.2.17: IterDataset.mp_prefetch builds its stage itself
        _process_prefetch = None

    def _multiprocess_prefetch(ds, num_workers=0, buffer_size=1, worker_init_fn=None, sequential_slice=False):
        options = grain.multiprocessing.MultiprocessingOptions(num_workers=num_workers,
                                                               per_worker_buffer_size=buffer_size)
        return spindle.grain.mp_prefetch(ds, options, worker_init_fn=worker_init_fn,
                                         sequential_slice=sequential_slice)

    grain.DataLoader = grain.python.DataLoader = _data_loader.DataLoader = spindle.grain.DataLoader
    if _process_prefetch is not None:
        _process_prefetch.multiprocess_prefetch = _multiprocess_prefetch
    else:
        def _mp_prefetch(ds, options=None, worker_init_fn=None):
            return spindle.grain.mp_prefetch(ds, options, worker_init_fn=worker_init_fn)

        grain.IterDataset.mp_prefetch = _mp_prefetch
        from spindle.grain import _compat as _spindle_compat

        if _spindle_compat.POOL:
            # Before 0.2.17 grain's tests also build the stage class itself: the class spindle.grain's
            # mp_prefetch builds there (grain's own, with spindle's workers in grain's pool's place).
            from grain._src.python.dataset.transformations import prefetch as _prefetch
            from spindle.grain._pool import PrefetchDataset

            _prefetch.MultiprocessPrefetchIterDataset = PrefetchDataset
