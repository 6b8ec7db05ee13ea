"""spindle.torch on the torch it finds: the compat module owns every private name of torch, and on a
torch it was not checked on (newer than the tested range, or a name missing or changed) every loader
runs on torch's own workers, with one warning naming the version and the reason."""

import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from spindle.torch import _compat  # noqa: E402

PACKAGE = pathlib.Path(__import__("spindle").__file__).parent

# torch's private names spindle uses (spindle.torch._compat's table), and the modules that may name them.
PRIVATE = ("_MultiProcessingDataLoaderIter", "_index_sampler", "_auto_collation", "_IterableDataset_len_called",
           "_generate_state", "_worker_info", "default_collate_fn_map", "collate_tensor_fn", "_num_samples",
           "_utils.pin_memory", "data._utils")
OWNERS = {"torch/_compat.py": PRIVATE, "_autoinstall.py": ("_MultiProcessingDataLoaderIter",)}


def test_only_the_compat_module_names_torchs_privates():
    """Proves: no module of the package but spindle.torch._compat names a private of torch (the
    SPINDLE_TORCH=1 hook, which must not import torch, names only the iterator it replaces)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        for name in PRIVATE:
            if re.search(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"\b", text) and name not in OWNERS.get(relative, ()):
                found.append(f"{relative}: {name}")
    assert found == []


def test_the_hook_names_the_iterator_the_compat_module_owns():
    """Proves: spindle._autoinstall (no torch import) patches the module and name _compat checks."""
    from spindle import _autoinstall

    assert (_autoinstall._MODULE, _autoinstall._NAME) == (_compat.ITERATOR_MODULE, _compat.ITERATOR_NAME)


def test_this_torch_is_served():
    """Proves: the installed torch (one of the tested releases) passes the check."""
    assert _compat.version_of(torch.__version__) <= _compat.NEWEST
    assert _compat.FALLBACK is None
    assert _compat.incompatibility(torch.__version__) is None


@pytest.mark.parametrize("version, words", [
    ("2.15.0", "torch 2.15.0 is newer than the newest release spindle.torch was checked on (2.14.1)"),
    ("3.0.0.dev20270101", "torch 3.0.0.dev20270101 is newer than"),
    ("2.3.1+cu121", "torch 2.3.1+cu121 is older than the oldest release spindle.torch supports (2.4.1)"),
    ("nightly", "not a torch version: 'nightly'"),
])
def test_a_release_outside_the_tested_range_is_named(version, words):
    """Proves: a version outside 2.4-2.14 is a reason to fall back, and the reason names it."""
    assert words in _compat.incompatibility(version)


def test_force_tries_a_newer_release_whose_names_are_all_there():
    """Proves: SPINDLE_TORCH_COMPAT=force (force=True) lets a newer version through when its names are there."""
    assert _compat.incompatibility("2.15.0", force=True) is None


def test_a_missing_or_changed_name_is_named():
    """Proves: the check looks every needed name up; one that is gone, or takes other parameters, is the
    reason, with the error the lookup gave."""
    needed = _compat._needed()
    assert len(needed) >= 14
    gone = dict(needed, **{"DataLoader._index_sampler": lambda: torch.utils.data.DataLoader._no_such_name})
    reason = _compat.incompatibility(torch.__version__, gone)
    assert reason.startswith(f"torch {torch.__version__} has no DataLoader._index_sampler as spindle.torch knows it "
                             "(AttributeError:")

    def other(seed, wid):
        return seed
    changed = dict(needed, **{"torch.utils.data._utils.worker._generate_state(base_seed, worker_id)":
                              lambda: _compat.has_parameters(other, "base_seed", "worker_id")})
    reason = _compat.incompatibility(torch.__version__, changed)
    assert "_generate_state(base_seed, worker_id) as spindle.torch knows it (TypeError: takes no parameter " \
           "base_seed, worker_id)" in reason


FALLBACK_RUN = textwrap.dedent("""
    import sys, warnings
    import torch
    from torch.utils.data import DataLoader as TorchLoader
    {prepare}
    import spindle.torch
    from spindle.errors import PeerVersionWarning
    from spindle.torch import DataLoader, _compat

    if __name__ == "__main__":
        assert _compat.FALLBACK is not None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            spindle.torch.install()
            assert not spindle.torch.installed()
            loader = DataLoader(list(range(50)), batch_size=4, shuffle=True, num_workers=2,
                                generator=torch.Generator().manual_seed(7), multiprocessing_context="{method}")
            it = iter(loader)
            kind = type(it).__name__
            got = [b.tolist() for b in it]
            again = [b.tolist() for b in loader]
            plain = TorchLoader(list(range(50)), batch_size=4, num_workers=2, multiprocessing_context="{method}")
            plain_kind = type(iter(plain)).__name__
        expected = [b.tolist() for b in TorchLoader(list(range(50)), batch_size=4, shuffle=True,
                                                    generator=torch.Generator().manual_seed(7))]
        again_expected = [b.tolist() for b in TorchLoader(list(range(50)), batch_size=4, shuffle=True,
                                                          generator=torch.Generator().manual_seed(7))]
        ours = [w for w in caught if issubclass(w.category, PeerVersionWarning)]
        print(kind, plain_kind, got == expected, len(ours))
        print(ours[0].message if ours else "")
""")


def _fallback_run(tmp_path, prepare, method="fork"):
    script = tmp_path / "fallback.py"
    script.write_text(FALLBACK_RUN.format(prepare=prepare, method=method))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_newer_torch_runs_every_loader_on_torchs_workers_with_one_warning(tmp_path, method):
    """Proves: on a torch newer than the tested range (torch.__version__ set to 2.99.0 before spindle.torch
    is imported) spindle.torch.DataLoader iterates on torch's own iterator, with torch's batches for the
    same generator, install() leaves torch's iterator in place, and one PeerVersionWarning names the
    version and the reason."""
    lines = _fallback_run(tmp_path, "torch.__version__ = '2.99.0'", method)
    assert lines[0] == "_MultiProcessingDataLoaderIter _MultiProcessingDataLoaderIter True 1"
    assert lines[1] == ("spindle.torch: every DataLoader runs on torch's own workers: torch 2.99.0 is newer than "
                        "the newest release spindle.torch was checked on (2.14.1); set SPINDLE_TORCH_COMPAT=force "
                        "to try spindle's workers on it")


def test_a_torch_whose_private_name_changed_runs_on_torchs_workers(tmp_path):
    """Proves: a torch whose _generate_state takes other parameter names (a stand-in that still works for
    torch's own workers) is served by torch's workers, and the warning names the changed name."""
    prepare = textwrap.dedent("""
        from torch.utils.data._utils import worker
        _real = worker._generate_state
        worker._generate_state = lambda seed, wid: _real(seed, wid)
    """)
    lines = _fallback_run(tmp_path, prepare)
    assert lines[0] == "_MultiProcessingDataLoaderIter _MultiProcessingDataLoaderIter True 1"
    assert "has no torch.utils.data._utils.worker._generate_state(base_seed, worker_id) as spindle.torch knows " \
           "it (TypeError: takes no parameter base_seed, worker_id)" in lines[1]


def test_a_stateful_loader_on_a_newer_torch_is_torchdatas(tmp_path):
    """Proves: spindle.torch.StatefulDataLoader on a torch outside the range runs torchdata's own loop, and
    its state resumes there."""
    pytest.importorskip("torchdata.stateful_dataloader")
    script = tmp_path / "stateful.py"
    script.write_text(textwrap.dedent("""
        import warnings
        import torch
        torch.__version__ = "2.99.0"
        from spindle.torch import StatefulDataLoader

        if __name__ == "__main__":
            warnings.simplefilter("ignore")
            loader = StatefulDataLoader(list(range(20)), batch_size=2, num_workers=2)
            it = iter(loader)
            first = [next(it).tolist() for _ in range(3)]
            state = loader.state_dict()
            again = StatefulDataLoader(list(range(20)), batch_size=2, num_workers=2)
            again.load_state_dict(state)
            rest = [b.tolist() for b in again]
            print(type(it).__name__, first + rest == [[i, i + 1] for i in range(0, 20, 2)])
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["_StatefulMultiProcessingDataLoaderIter", "True"]


def test_the_constructor_passes_a_newer_keyword_only_where_torch_has_it():
    """Proves: in_order (torch 2.6) goes to torch's constructor only where it takes it; the loader has the
    attribute either way (frameworks re-create loaders from their attributes)."""
    from spindle.torch import DataLoader

    assert _compat.accepts(torch.utils.data.DataLoader, "in_order") == (_compat.version_of(torch.__version__) >= (2, 6))
    loader = DataLoader(list(range(4)), batch_size=2)
    assert loader.in_order is True
    if not _compat.accepts(torch.utils.data.DataLoader, "in_order"):
        with pytest.raises(TypeError, match="in_order"):
            DataLoader(list(range(4)), in_order=False)
