import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/unprivileged.py


@pytest.fixture(autouse=True)
def no_shared_memory_left():
    """Every test must leave no spindle segment of this process in /dev/shm."""
    yield
    mine = [n for n in os.listdir("/dev/shm") if n.startswith(f"spindle.{os.getpid()}.")]
    assert mine == [], f"shared memory left behind: {mine}"
