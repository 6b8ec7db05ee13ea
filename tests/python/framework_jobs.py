"""The training programs of tests/python/test_frameworks.py, each run in a subprocess.

    python framework_jobs.py lightning OUT_DIR DEVICES
    torchrun --nproc-per-node 2 framework_jobs.py accelerate OUT_DIR loader|install
    python framework_jobs.py trainer OUT_DIR

Each program trains a tiny model on ``Indexed``, whose sample i is the tensor
i, and whose ``__getitem__`` appends "tag i process-name" to
OUT_DIR/names.<pid>.txt (the tag says which run of the program loaded it; the
name is ``multiprocessing.current_process().name``, SpindleWorker-<n> in
spindle's workers). A program writes what its training steps saw to
OUT_DIR/<program>...rank<r>.json.

- ``lightning``: Lightning's Trainer (accelerator="cpu"; with DEVICES 2,
  strategy="ddp", which starts rank 1 by running this script again) fits twice
  from the same seed, 2 epochs each: first with torch's DataLoader returned by
  ``train_dataloader()`` (tag "torch"), then with ``spindle.torch.DataLoader``
  (tag "spindle"); each rank writes the indices of each epoch.
- ``accelerate`` (under torchrun, gloo): ``Accelerator(cpu=True,
  gradient_accumulation_steps=3)`` prepares a loader and trains one epoch,
  then iterates ``skip_first_batches(dl, 2)`` (tag "<tag>-skip"); first with
  torch's DataLoader (tag "torch"), then (tag "spindle") with ``spindle.torch.DataLoader``
  (``loader``) or with torch's DataLoader after ``spindle.torch.install()``
  (``install``, undone by ``uninstall()`` after).
- ``trainer``: after ``spindle.torch.install()``, HF transformers' Trainer
  trains a tiny torch module for 4 steps with ``dataloader_num_workers=2``
  (tag "trainer").
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys

import torch

SAMPLES = 64
BATCH = 4
SEED = 1234


class Indexed(torch.utils.data.Dataset):
    """Sample i is torch.tensor(i); each load is written down with the loading process's name."""

    def __init__(self, out: str, tag: str, as_dict: bool = False) -> None:
        self.out, self.tag, self.as_dict = out, tag, as_dict

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int):
        with open(os.path.join(self.out, f"names.{os.getpid()}.txt"), "a") as f:
            f.write(f"{self.tag} {i} {multiprocessing.current_process().name}\n")
        if self.as_dict:
            return {"x": torch.tensor([float(i)]), "labels": torch.tensor(float(i % 2))}
        return torch.tensor(i)


def write_json(path: str, value: object) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def write_pid(out: str, name: str) -> None:
    """The test looks for shared memory of this process left in /dev/shm after the job."""
    with open(os.path.join(out, f"pid.{name}.{os.getpid()}"), "w") as f:
        f.write(str(os.getpid()))


def lightning(out: str, devices: int) -> None:
    import pytorch_lightning as pl

    import spindle.torch

    class Model(pl.LightningModule):
        def __init__(self, loader_class: type, tag: str) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.loader_class, self.tag = loader_class, tag
            self.seen: dict[int, list[int]] = {}

        def train_dataloader(self):
            return self.loader_class(Indexed(out, self.tag), batch_size=BATCH, shuffle=True, num_workers=2)

        def training_step(self, batch, batch_idx):
            self.seen.setdefault(self.current_epoch, []).extend(batch.tolist())
            return self.layer(batch.float().unsqueeze(1)).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.001)

    write_pid(out, f"lightning{devices}")
    for tag, loader_class in (("torch", torch.utils.data.DataLoader), ("spindle", spindle.torch.DataLoader)):
        pl.seed_everything(SEED, verbose=False)
        model = Model(loader_class, tag)
        trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                             max_epochs=2, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=out)
        trainer.fit(model)
        write_json(os.path.join(out, f"lightning{devices}.{tag}.rank{trainer.global_rank}.json"),
                   {str(epoch): indices for epoch, indices in model.seen.items()})


def accelerate(out: str, mode: str) -> None:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    import spindle.torch

    write_pid(out, f"accelerate-{mode}")
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    results = {}
    for tag in ("torch", "spindle"):
        if tag == "spindle" and mode == "install":
            spindle.torch.install()
        loader_class = spindle.torch.DataLoader if tag == "spindle" and mode == "loader" else torch.utils.data.DataLoader
        set_seed(SEED)
        dataset = Indexed(out, tag)
        loader = loader_class(dataset, batch_size=BATCH, shuffle=True, num_workers=2)
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
        model, optimizer, dl = accelerator.prepare(model, optimizer, loader)
        order, syncs, ends = [], [], []
        for batch in dl:
            with accelerator.accumulate(model):
                accelerator.backward(model(batch.float().unsqueeze(1)).sum())
                optimizer.step()
                optimizer.zero_grad()
                syncs.append(accelerator.sync_gradients)
                ends.append(accelerator.gradient_state.end_of_dataloader)
            order.append(batch.tolist())
        dataset.tag = f"{tag}-skip"  # the workers of the skipping loader start (fork or spawn) with this tag
        skipper = accelerator.skip_first_batches(dl, 2)
        skipped = [batch.tolist() for batch in skipper]
        results[tag] = {"order": order, "syncs": syncs, "ends": ends, "skipped": skipped,
                        "prepared": type(dl).__name__, "untouched": dl is loader,
                        "skipper": type(skipper).__name__}
        if tag == "spindle" and mode == "install":
            spindle.torch.uninstall()
        accelerator.free_memory()
    write_json(os.path.join(out, f"accelerate.{mode}.rank{accelerator.process_index}.json"), results)
    accelerator.end_training()


def trainer(out: str) -> None:
    import spindle.torch

    spindle.torch.install()
    from transformers import Trainer, TrainingArguments

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def forward(self, x, labels):
            return {"loss": ((self.layer(x).squeeze(-1) - labels) ** 2).mean()}

    write_pid(out, "trainer")
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, max_steps=4,
                             dataloader_num_workers=2, use_cpu=True, report_to="none", save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, remove_unused_columns=False, seed=SEED)
    run = Trainer(model=Tiny(), args=args, train_dataset=Indexed(out, "trainer", as_dict=True))
    run.train()
    write_json(os.path.join(out, "trainer.rank0.json"), {"global_step": run.state.global_step})
    spindle.torch.uninstall()


if __name__ == "__main__":
    program, out_dir = sys.argv[1], sys.argv[2]
    if program == "lightning":
        lightning(out_dir, int(sys.argv[3]))
    elif program == "accelerate":
        accelerate(out_dir, sys.argv[3])
    elif program == "trainer":
        trainer(out_dir)
    else:
        sys.exit(f"framework_jobs.py: unknown program {program!r} (lightning, accelerate or trainer)")
