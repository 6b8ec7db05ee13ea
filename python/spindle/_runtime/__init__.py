"""spindle's runtime layer (private): what every front end runs its epochs on.

- ``epoch``: EpochIterator, one epoch over a runtime Loader (``_core.Loader``), the
  iterator every front end hands out or wraps.
- ``worker``: the bodies of a worker process (run_worker, run_stream_worker), seeding,
  and the consumer's decoder of a leased slot.
- ``layout``: how a batch is laid out in a slot (SlotWriter in the worker, BatchReader
  in the consumer).
- ``failures``: a worker's exception packed into its slot, and re-raised in the consumer.
- ``start``: the one start path: a frozen StartSpec, then start() / start_pipeline(), which
  apply the budget policy, fork or spawn, and warn when the budget shrank the loader.
- ``forking`` / ``spawned``: starting workers by fork, or as new interpreters.
- ``persistent``: the one reset-or-restart decision of persistent workers.
- ``stats``: the loader's statistics as users read them (``it.stats()``), workers' memory included.
- ``shared_containers``: SharedList / SharedDict, plain values stored once in shared memory (the
  public ``spindle.shared``).
- ``sharing``: ``share="auto"``, what the workers get of the dataset (shared containers in its
  place), and MemoryWatch, what each worker pays for it.

The layers and the rule between them:

    Front ends (spindle.dataloader, spindle.torch, spindle.grain, spindle.pipeline) use
    the runtime (spindle._runtime), budget (spindle._budget) and state (spindle._state)
    layers, plus spindle._core and spindle.errors, and never another front end or its
    private names. A transport that only one front end uses lives in that front end.
    The layers never import a front end. tests/python/test_layers.py enforces this.
"""
