"""Ray Train (issue 33): ray.train.torch.TorchTrainer with 2 CPU workers on this machine, each building a
spindle.torch loader and passing it through ray.train.torch.prepare_data_loader.

Not part of `make test` (Ray is a 270 MB install and a local cluster takes ~20 s to start): `make test-ray`
installs Ray into .venv-ray (layered on .venv's torch and spindle) and runs this file; its runs are recorded
in bench/results/history/."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from ray.train import RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402
from torch.utils.data import DistributedSampler  # noqa: E402

SAMPLES, BATCH, SEED = 96, 4, 17


class Ids(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


def epoch(loader) -> dict:
    it = iter(loader)
    seen = [int(i) for batch in it for i in batch.flatten()]
    return {"ids": seen, "iterator": f"{type(it).__module__}.{type(it).__qualname__}",
            "workers": len(getattr(it, "_workers", []))}


def train_loop(config: dict) -> None:
    import ray.train
    from ray.train.torch import prepare_data_loader

    import spindle.doctor
    import spindle.torch as st

    rank = ray.train.get_context().get_world_rank()
    record: dict = {"rank": rank, "world": ray.train.get_context().get_world_size()}
    # A sharded spindle loader: its sampler is a DistributedSampler, so Ray keeps the loader.
    sharded = st.DataLoader(Ids(), batch_size=BATCH, shuffle=True, num_workers=2, shard="auto", shard_seed=SEED)
    prepared = prepare_data_loader(sharded, move_to_device=False)
    record["sharded"] = {"kept": prepared is sharded, "shard": [sharded._shard.rank, sharded._shard.world_size,
                                                                sharded._shard.source], **epoch(prepared)}
    # An unsharded one: Ray rebuilds a stock torch DataLoader with a DistributedSampler over its dataset.
    # Recorded, not asserted: that loader runs on torch's workers unless spindle.torch.install() is in
    # effect (docs/distributed.md, "Ray Train").
    plain = st.DataLoader(Ids(), batch_size=BATCH, shuffle=True, num_workers=2)
    prepared = prepare_data_loader(plain, move_to_device=False)
    record["plain"] = {"kept": prepared is plain, "class": type(prepared).__module__ + "." + type(prepared).__name__,
                       **epoch(prepared)}
    st.install()  # as SPINDLE_TORCH=1 does for a train loop you do not edit
    try:
        prepared = prepare_data_loader(st.DataLoader(Ids(), batch_size=BATCH, shuffle=True, num_workers=2),
                                       move_to_device=False)
        record["installed"] = {"class": type(prepared).__module__ + "." + type(prepared).__name__,
                               **epoch(prepared)}
    finally:
        st.uninstall()
    report = spindle.doctor.collect()
    record["doctor"] = {"uid_tasks": report["use"]["uid_tasks"],
                        "processes": [(p["name"], p["threads"]) for p in report["processes"]
                                      if p["name"] in ("raylet", "gcs_server") or p["name"].startswith("ray::")],
                        "leases": len(report["leases"]["entries"])}
    Path(config["out"], f"{rank}.json").write_text(json.dumps(record))


def sampler_order(world: int, rank: int, seed: int) -> list[int]:
    return list(DistributedSampler(range(SAMPLES), num_replicas=world, rank=rank, shuffle=True, seed=seed))


@pytest.mark.timeout(600)
def test_ray_train_workers_load_their_shards_on_spindle_processes(tmp_path, monkeypatch):
    """Proves: TorchTrainer with 2 CPU workers: prepare_data_loader keeps a spindle.torch.DataLoader(shard="auto")
    (its sampler is a DistributedSampler; shard="auto" reads the process group Ray set up) and each worker loads
    DistributedSampler's part on spindle's worker processes; an unsharded spindle loader, which Ray rebuilds as a
    torch DataLoader with its own DistributedSampler, loads that part on spindle's processes under
    spindle.torch.install(); spindle doctor in a Ray worker counts Ray's processes (raylet) and their threads."""
    # Ray's workers unpickle train_loop by this module's name; its token goes to HOME.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("HOME", str(tmp_path))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        trainer = TorchTrainer(train_loop, train_loop_config={"out": str(tmp_path)},
                               scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                               run_config=RunConfig(storage_path=str(tmp_path / "ray"), name="spindle"))
        trainer.fit()
    finally:
        ray.shutdown()
    found = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    for r in found:
        print({k: {"iterator": r[k]["iterator"], "workers": r[k]["workers"]}
               for k in ("sharded", "plain", "installed")})
        print("doctor:", r["doctor"])
    assert [(r["rank"], r["world"]) for r in found] == [(0, 2), (1, 2)]
    for r in found:
        assert r["sharded"]["kept"] and r["sharded"]["shard"] == [r["rank"], 2, "torch.distributed"]
        assert r["sharded"]["ids"] == sampler_order(2, r["rank"], SEED)
        assert r["sharded"]["iterator"].startswith("spindle.") and r["sharded"]["workers"] == 2
        assert not r["plain"]["kept"] and r["plain"]["class"] == "torch.utils.data.dataloader.DataLoader"
        assert r["plain"]["ids"] == sampler_order(2, r["rank"], 0)  # Ray's DistributedSampler: seed 0
        # the rebuilt loader is adopted: its DistributedSampler is over a spindle loader's dataset
        assert r["plain"]["iterator"].startswith("spindle.") and r["plain"]["workers"] == 2
        installed = r["installed"]
        assert installed["class"] == "torch.utils.data.dataloader.DataLoader"
        assert installed["ids"] == sampler_order(2, r["rank"], 0)
        assert installed["iterator"].startswith("spindle.") and installed["workers"] == 2
        names = [name for name, _ in r["doctor"]["processes"]]
        assert "raylet" in names, names
        assert r["doctor"]["uid_tasks"] >= sum(threads for _, threads in r["doctor"]["processes"])
    assert sorted(found[0]["sharded"]["ids"] + found[1]["sharded"]["ids"]) == list(range(SAMPLES))
