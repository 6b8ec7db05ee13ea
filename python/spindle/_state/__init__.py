"""spindle's state layer (private): checkpoints and sharding, shared by the front ends.

- ``checkpoint``: versioned, JSON-able loader states, positions in an epoch, per-sample seeds.
- ``epoch_plan``: a map-style loader's epochs (order, entropy, length per rank, position, state).
- ``sharding``: a rank's part of an epoch (shard="auto" or (rank, world_size)).
- ``elastic``: resuming a state saved at another world size.
- ``mix``: the weighted mix of map-style sources (the public ``spindle.mix`` and ``Mix``): an
  element is a function of (seed, weights, lengths, index), the same after any resume.

See spindle._runtime for the rule between layers and front ends.
"""
