"""shard=: the DistributedSampler a spindle.torch loader builds for its rank (docs/distributed.md)."""

from __future__ import annotations

from typing import Any, Optional

from torch.utils.data import IterableDataset
from torch.utils.data.distributed import DistributedSampler


def shard_sampler(shard: Any, dataset: Any, shuffle: Optional[bool], sampler: Any, batch_sampler: Any,
                   seed: int, drop_last: bool) -> Any:
    """The DistributedSampler that `shard` stands for; refuses what it cannot shard."""
    if isinstance(dataset, IterableDataset):
        raise ValueError("spindle: shard= needs a map-style dataset; an IterableDataset shards itself "
                         "(e.g. with torch.distributed.get_rank() and get_world_size() in its __iter__)")
    if sampler is not None or batch_sampler is not None:
        raise ValueError("spindle: shard= builds the sampler (a DistributedSampler) and cannot be combined with "
                         "sampler= or batch_sampler=; pass your own DistributedSampler as sampler= instead")
    return ShardSampler(dataset, num_replicas=shard.world_size, rank=shard.rank, shuffle=bool(shuffle),
                         seed=seed, drop_last=drop_last)


class ShardSampler(DistributedSampler):
    """shard='s DistributedSampler: the loader sets its epoch at each iter() unless someone else
    called set_epoch since the last one (`told`)."""

    told = False

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.told = True
