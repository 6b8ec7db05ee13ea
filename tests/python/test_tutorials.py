"""Tutorial-style programs from torch's and grain's docs, run twice: as written, and with only the
import line changed to spindle. What may differ is recorded in docs/torch_dropin.md and docs/grain_dropin.md."""

import pickle
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
grain = pytest.importorskip("grain")
from absl import flags  # noqa: E402

flags.FLAGS.mark_as_parsed()

# The shape of torch's "Writing Custom Datasets, DataLoaders and Transforms" tutorial:
# a Dataset of images with landmarks, callable transforms composed, then a DataLoader.
TORCH_TUTORIAL = textwrap.dedent('''
    import numpy as np
    import torch
    from torch.utils.data import Dataset
    from torchvision_free_transforms import Compose, Rescale, RandomCrop, ToTensor
    {import_line}

    class FaceLandmarksDataset(Dataset):
        def __init__(self, n, transform=None):
            rng = np.random.default_rng(0)
            self.images = rng.integers(0, 255, size=(n, 40, 30, 3), dtype=np.uint8)
            self.landmarks = rng.random((n, 68, 2)).astype(np.float64) * 30
            self.transform = transform

        def __len__(self):
            return len(self.images)

        def __getitem__(self, idx):
            if torch.is_tensor(idx):
                idx = idx.tolist()
            sample = {{"image": self.images[idx], "landmarks": self.landmarks[idx]}}
            if self.transform:
                sample = self.transform(sample)
            return sample

    transformed_dataset = FaceLandmarksDataset(64, transform=Compose([Rescale(32), RandomCrop(24), ToTensor()]))
    dataloader = DataLoader(transformed_dataset, batch_size=4, shuffle=True, num_workers=2,
                            generator=torch.Generator().manual_seed(0))
    batches = []
    for i_batch, sample_batched in enumerate(dataloader):
        batches.append(sample_batched)
''')

TRANSFORMS = textwrap.dedent('''
    import numpy as np
    import torch

    class Compose:
        def __init__(self, transforms):
            self.transforms = transforms
        def __call__(self, sample):
            for t in self.transforms:
                sample = t(sample)
            return sample

    class Rescale:
        def __init__(self, output_size):
            self.output_size = output_size
        def __call__(self, sample):
            image, landmarks = sample["image"], sample["landmarks"]
            h, w = image.shape[:2]
            new_h, new_w = self.output_size, self.output_size * w // h
            rows = np.arange(new_h) * h // new_h
            cols = np.arange(new_w) * w // new_w
            return {"image": image[rows][:, cols], "landmarks": landmarks * [new_w / w, new_h / h]}

    class RandomCrop:
        def __init__(self, output_size):
            self.output_size = output_size
        def __call__(self, sample):
            image, landmarks = sample["image"], sample["landmarks"]
            h, w = image.shape[:2]
            top = np.random.randint(0, h - self.output_size + 1)
            left = np.random.randint(0, w - self.output_size + 1)
            image = image[top: top + self.output_size, left: left + self.output_size]
            return {"image": image, "landmarks": landmarks - [left, top]}

    class ToTensor:
        def __call__(self, sample):
            image = sample["image"].transpose((2, 0, 1))
            return {"image": torch.from_numpy(image.copy()), "landmarks": torch.from_numpy(sample["landmarks"])}
''')


def run(source, tmp_path):
    (tmp_path / "torchvision_free_transforms.py").write_text(TRANSFORMS)
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        scope = {}
        exec(compile(source, "tutorial.py", "exec"), scope)
        return scope["batches"]
    finally:
        sys.path.remove(str(tmp_path))


def test_torch_custom_dataset_tutorial_runs_with_only_the_import_changed(tmp_path):
    """The tutorial's loop runs unchanged on spindle.torch and gives torch's batches exactly, random crops
    included (same batch-to-worker assignment and per-worker numpy seeds as torch)."""
    theirs = run(TORCH_TUTORIAL.format(import_line="from torch.utils.data import DataLoader"), tmp_path)
    ours = run(TORCH_TUTORIAL.format(import_line="from spindle.torch import DataLoader"), tmp_path)
    assert len(ours) == len(theirs) == 16
    for a, b in zip(ours, theirs):
        assert list(a) == list(b) == ["image", "landmarks"]
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape
            assert torch.equal(a[key], b[key])


def write_array_record(path, n):
    from array_record.python import array_record_module

    writer = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
    for i in range(n):
        writer.write(pickle.dumps({"image": np.full((8, 8, 3), i % 251, np.uint8), "label": i}))
    writer.close()


class ParseFeatures(grain.transforms.Map):
    def map(self, record):
        features = pickle.loads(record)
        return {"image": features["image"].astype(np.float32) / 255.0, "label": np.int64(features["label"])}


class RandomFlip(grain.transforms.RandomMap):
    def random_map(self, element, rng):
        if rng.random() < 0.5:
            element["image"] = element["image"][:, ::-1]
        return element


GRAIN_TUTORIAL = textwrap.dedent('''
    import grain
    {import_line}
    source = grain.sources.ArrayRecordDataSource([path])
    sampler = grain.samplers.IndexSampler(num_records=len(source), shard_options=grain.sharding.NoSharding(),
                                          shuffle=True, num_epochs=1, seed=42)
    loader = DataLoader(data_source=source, sampler=sampler,
                        operations=[ParseFeatures(), RandomFlip(), grain.transforms.Batch(batch_size=8)],
                        worker_count=2)
    batches = [batch for batch in loader]
''')


def test_grain_array_record_tutorial_runs_with_only_the_import_changed(tmp_path):
    """grain's ArrayRecord source, a parsing Map, a RandomMap and Batch give identical batches on spindle.grain."""
    path = tmp_path / "data.array_record"
    write_array_record(path, 60)
    outputs = []
    for import_line in ("from grain import DataLoader", "from spindle.grain import DataLoader"):
        scope = {"path": str(path), "ParseFeatures": ParseFeatures, "RandomFlip": RandomFlip}
        exec(compile(GRAIN_TUTORIAL.format(import_line=import_line), "tutorial.py", "exec"), scope)
        outputs.append(scope["batches"])
    theirs, ours = outputs
    assert len(ours) == len(theirs) == 8
    for a, b in zip(ours, theirs):
        assert list(a) == list(b)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
