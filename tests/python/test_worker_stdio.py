"""A line a program printed before starting processes-mode workers (left in
stdout's buffer: stdout is a file, so fully buffered) appears once in that file,
not once more per worker: workers never flush the stdio they inherited."""

import os
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import ctypes, sys
    import numpy as np
    import spindle
    from spindle import pipeline as sp

    kind, root = sys.argv[1], sys.argv[2]
    print("a python line printed before the loader starts")    # in sys.stdout's buffer
    libc = ctypes.CDLL(None)
    libc.printf(b"a C line printed before the loader starts\\n")  # in C stdout's buffer
    if kind == "dataloader":
        loader = spindle.DataLoader(np.arange(64, dtype=np.int64), batch_size=8, num_workers=2)
    else:
        loader = spindle.PipelineLoader(sp.arrays(root).batch(8), num_workers=2, mode="processes")
    n = sum(1 for _ in loader)
    print(f"{n} batches")
    libc.fflush(None)
""")


@pytest.mark.parametrize("kind", ["dataloader", "pipeline"])
def test_a_line_printed_before_a_processes_loader_appears_once(tmp_path, kind):
    """Proves: with stdout redirected to a file and 2 forked workers, Python's and C's pending lines appear once each."""
    import numpy as np

    np.save(tmp_path / "rows.npy", np.zeros((64, 8, 8, 3), np.uint8))
    out = tmp_path / "out.txt"
    # Buffered as in a job's log: PYTHONUNBUFFERED (or -u) would make Python's and C's stdout write at once.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open(out, "w") as f:
        subprocess.run([sys.executable, "-c", PROGRAM, kind, str(tmp_path / "rows.npy")], stdout=f, check=True,
                       timeout=120, env=env)
    text = out.read_text()
    assert text.count("a python line printed before the loader starts") == 1, text
    assert text.count("a C line printed before the loader starts") == 1, text
    assert "8 batches" in text, text
