"""spindle's thread-budget layer (private): how many threads a loader may add, and keeping
the pools of other runtimes to one thread in the workers.

- ``caps``: thread-pool caps in workers (OpenBLAS, OpenMP, ...) and the thread watchdog.
- ``reserve``: what a start holds back from its workers: the consumer's reserve and the workers'
  runtime threads.
- ``threads``: reading a process's threads and which runtime started them (/proc).
- ``policy``: the budget policy (resolved by the core: ``_core.resolve_budget_policy``) and its
  shrink warning.
- ``runtimes``: the one table of thread-pool runtimes (variables, patterns, cap calls, advice).

Nothing here imports numpy at import time: ``import spindle`` loads ``threads``.
See spindle._runtime for the rule between layers and front ends.
"""
