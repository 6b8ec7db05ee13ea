"""WebDataset shards by URL (docs/streaming.md): http:// against a real server on 127.0.0.1
started here (tests/python/shard_server.py), pipe:CMD, brace notation, retries, timeouts and
the local cache, compared byte for byte with the same shards read from local disk."""

import io
import os
import signal
import socket
import subprocess
import sys
import tarfile
import textwrap
import time

import numpy as np
import pytest

import spindle
from spindle import DataError, _core
from spindle import pipeline as sp
from shard_server import ShardServer

PIL = pytest.importorskip("PIL.Image")

NUM_SHARDS, PER_SHARD = 4, 6


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """4 shards of 6 small JPEGs (key.jpg + key.cls), as local paths."""
    root = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    paths = []
    for s in range(NUM_SHARDS):
        path = root / f"shard-{s:03d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for k in range(PER_SHARD):
                img = rng.integers(0, 255, (40 + k, 56, 3), dtype=np.uint8)
                buf = io.BytesIO()
                PIL.fromarray(img).save(buf, format="JPEG", quality=90)
                for name, data in ((f"s{s}_{k:02d}.jpg", buf.getvalue()), (f"s{s}_{k:02d}.cls", str(k % 3).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def server(shards):
    with ShardServer(os.path.dirname(shards[0])) as srv:
        yield srv


def samples_of(urls, **fetch):
    """Every sample of every shard through the native reader, as (key, {field: bytes}) lists."""
    options = _core.ShardOptions()
    for name, value in fetch.items():
        setattr(options, name, value)
    ds = _core.WebDataset(urls, options)
    return [[(d["__key__"], {k: v for k, v in d.items() if not k.startswith("__")}) for d in ds.iter_shard(s)]
            for s in range(ds.num_shards)]


def batches(pipe, **kw):
    return [(b["image"].copy(), b["label"].copy()) for b in spindle.PipelineLoader(pipe, seed=5, **kw)]


def names(shards):
    return [os.path.basename(p) for p in shards]


@pytest.mark.parametrize("mode", ["processes", "threads"])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_url_shards_equal_local_files_bit_for_bit(shards, server, mode, workers):
    """Proves: the same shards over http:// give the same batches as from local disk, in both modes
    and with 1, 2 and 3 workers."""
    urls = [server.url(n) for n in names(shards)]
    local = batches(sp.webdataset(shards).decode().center_crop(32).batch(4), num_workers=workers, mode=mode)
    remote = batches(sp.webdataset(urls).decode().center_crop(32).batch(4), num_workers=workers, mode=mode)
    assert len(local) == len(remote) > 0
    for (li, ll), (ri, rl) in zip(local, remote):
        assert li.tobytes() == ri.tobytes() and ll.tolist() == rl.tolist()


def test_member_bytes_over_http_equal_the_files(shards, server):
    """Proves: each member's bytes read over http:// equal those read from the local file."""
    assert samples_of([server.url(n) for n in names(shards)]) == samples_of(shards)


def test_braces_and_lists_expand_as_webdataset_does(shards, server):
    """Proves: "{000..003}" (zero-padded), "{a,b}", several braces and "::" lists expand in
    webdataset's order, and a braced URL reads every shard."""
    assert _core.expand_shard_urls("s-{8..10}.tar") == ["s-8.tar", "s-9.tar", "s-10.tar"]
    assert _core.expand_shard_urls("s-{08..10}-{a,b}.tar::x.tar") == [
        "s-08-a.tar", "s-08-b.tar", "s-09-a.tar", "s-09-b.tar", "s-10-a.tar", "s-10-b.tar", "x.tar"]
    expand_urls = pytest.importorskip("webdataset.shardlists").expand_urls
    for spec in ("s-{8..010}.tar", "{x,y}-{009..011}.tar", "a-{0..3}-{1,2}::b-{7..9}"):
        assert _core.expand_shard_urls(spec) == expand_urls(spec), spec
    with pytest.raises(ValueError, match="s-{1..x}"):
        _core.expand_shard_urls("s-{1..x}.tar")
    pipe = sp.webdataset(server.url("shard-{000..003}.tar")).decode().center_crop(32).batch(4)
    assert pipe.source[1] == tuple(server.url(n) for n in names(shards))
    loader = spindle.PipelineLoader(pipe, num_workers=2)
    assert sum(len(b["label"]) for b in loader) == NUM_SHARDS * PER_SHARD
    # stats() counts the bytes streamed: every shard up to its end-of-archive block (the rest of
    # tarfile's 10 KiB record may or may not have arrived).
    total = sum(os.path.getsize(p) for p in shards)
    assert total - NUM_SHARDS * tarfile.RECORDSIZE <= loader.stats()["bytes_fetched"] <= total


@pytest.mark.parametrize("mode", ["processes", "threads"])
def test_a_checkpoint_resumes_each_stream_where_it_stood_without_fetching_its_shards_again(shards, server, mode):
    """Proves: a stream's state mid-epoch holds where each logical worker stands (shard and sample); a
    resume starts there: the rest equals the uninterrupted run's, the shards finished before the
    checkpoint are not fetched again, and a state without positions (an older spindle's) still resumes
    by reading its batches again."""
    urls = [server.url(n) for n in names(shards)]
    pipe = sp.webdataset(urls).decode().center_crop(32).random_flip().batch(4)
    whole = batches(pipe, num_workers=2, mode=mode)
    assert len(whole) == 6  # worker 0: shards 0 and 2, worker 1: shards 1 and 3; 6 samples a shard
    first = spindle.PipelineLoader(pipe, num_workers=2, seed=5, mode=mode)
    it = iter(first)
    for _ in range(4):
        next(it)
    state = first.state_dict()
    it.close()
    assert state["streams"]["next"] == 0 and len(state["streams"]["positions"]) == 2
    hits = dict(server.hits)
    resumed = spindle.PipelineLoader(pipe, num_workers=2, seed=5, mode=mode)
    resumed.load_state_dict(state)
    rest = [(b["image"].copy(), b["label"].copy()) for b in resumed]
    assert [(i.tobytes(), l.tolist()) for i, l in rest] == [(i.tobytes(), l.tolist()) for i, l in whole[4:]]
    fetched = {path: n - hits.get(path, 0) for path, n in server.hits.items() if n != hits.get(path, 0)}
    assert sorted(fetched) == ["/" + n for n in names(shards)[2:]], fetched  # shards 2 and 3 only
    older = {k: v for k, v in state.items() if k != "streams"}
    again = spindle.PipelineLoader(pipe, num_workers=2, seed=5, mode=mode)
    again.load_state_dict(older)
    assert [(b["image"].tobytes(), b["label"].tolist()) for b in again] == [(i.tobytes(), l.tolist())
                                                                           for i, l in whole[4:]]


def test_pipe_cat_reads_a_commands_stdout(shards):
    """Proves: pipe:cat shards give the same samples as the files; a failing command names its status."""
    assert samples_of([f"pipe:cat {p}" for p in shards]) == samples_of(shards)
    with pytest.raises(DataError, match=r"pipe:exit 3.*exited with status 3"):
        samples_of(["pipe:exit 3"])


def test_an_early_stop_kills_and_reaps_the_command(tmp_path):
    """Proves: a pass stopped before the command ended leaves no process behind (killed and reaped)."""
    pid_file = tmp_path / "pid"
    # The command prints a tar header's worth of garbage forever after noting its pid.
    ds = _core.WebDataset([f"pipe:echo $$ > {pid_file}; exec yes"])
    with pytest.raises(DataError):
        next(iter(ds.iter_shard(0)))
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_404_fails_at_once_naming_url_status_and_attempts(server):
    """Proves: a 404 is an error naming the URL, the status and one attempt (no retry)."""
    url = server.url("404/shard-000.tar")
    with pytest.raises(DataError, match=r"404/shard-000\.tar.*HTTP 404.*after 1 attempt") as info:
        samples_of([url], retries=3)
    assert info.value.path == url
    assert server.hits["/404/shard-000.tar"] == 1


def test_a_refused_connection_fails_at_once_naming_the_url():
    """Proves: nothing listening is an error naming the URL within the timeout, not retried."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    url = f"http://127.0.0.1:{port}/shard-000.tar"
    start = time.monotonic()
    with pytest.raises(DataError, match=rf"127\.0\.0\.1:{port}/shard-000\.tar.*after 1 attempt"):
        samples_of([url], retries=3, timeout=5.0)
    assert time.monotonic() - start < 5.0


def test_a_stalled_server_fails_within_the_timeout(server):
    """Proves: a server that stops sending mid-shard fails within (retries + 1) x timeout + backoff,
    naming the URL and the stall."""
    url = server.url("stall/3000/shard-001.tar")
    start = time.monotonic()
    with pytest.raises(DataError, match=r"stall/3000/shard-001\.tar.*stalled.*after 2 attempts"):
        samples_of([url], retries=1, timeout=1.0, backoff=0.1)
    assert time.monotonic() - start < 2 * 1.0 + 0.1 + 3.0


def test_a_connection_dropped_mid_shard_every_time_fails_naming_the_attempts(server):
    """Proves: a shard whose every response is cut mid-shard fails once retries are exhausted,
    naming the URL and the attempts."""
    with pytest.raises(DataError, match=r"drop/5000/shard-002\.tar.*after 3 attempts.*retries=2 exhausted"):
        samples_of([server.url("drop/5000/shard-002.tar")], retries=2, timeout=5.0, backoff=0.05)


def test_retries_recover_from_5xx_and_from_a_dropped_connection(shards, server):
    """Proves: two 500s then the file, and a connection cut mid-shard once, both read the whole shard
    (resuming with a Range request), equal to the local file."""
    want = samples_of([shards[0]])
    assert samples_of([server.url("fail/2/shard-000.tar")], retries=3, backoff=0.05) == want
    assert server.hits["/fail/2/shard-000.tar"] == 3
    assert samples_of([server.url("droponce/7000/shard-000.tar")], retries=1, backoff=0.05) == want
    with pytest.raises(DataError, match=r"HTTP 500.*after 2 attempts"):
        samples_of([server.url("fail/5/shard-003.tar")], retries=1, backoff=0.05)


def cached_files(cache):
    return sorted(p for p in os.listdir(cache) if not p.startswith("."))


def test_the_cache_keeps_whole_shards_within_its_limit(shards, server, tmp_path):
    """Proves: cached shards are byte-identical to the originals, their total stays under
    cache_limit_bytes (least recently used go first), and a cached shard is not fetched again."""
    cache = tmp_path / "cache"
    size = os.path.getsize(shards[0])
    limit = int(size * 2.5)
    urls = [server.url(f"fail/0/{n}") for n in names(shards)]  # own paths: hits counted here only
    want = samples_of(shards)
    assert samples_of(urls, cache_dir=str(cache), cache_limit_bytes=limit) == want
    kept = cached_files(cache)
    assert 1 <= len(kept) <= 2
    assert sum(os.path.getsize(cache / k) for k in kept) <= limit
    originals = {open(p, "rb").read() for p in shards}
    assert all((cache / k).read_bytes() in originals for k in kept)
    # The last shard read is kept; reading it again is served from the cache.
    before = server.hits[f"/fail/0/{names(shards)[-1]}"]
    assert samples_of(urls[-1:], cache_dir=str(cache), cache_limit_bytes=limit) == want[-1:]
    assert server.hits[f"/fail/0/{names(shards)[-1]}"] == before


def test_a_job_killed_mid_write_leaves_no_half_file(shards, server, tmp_path):
    """Proves: SIGKILL while a shard is being cached leaves no file under a shard's name, and the
    next reader removes the dead job's part file and caches the whole shard."""
    cache = tmp_path / "cache"
    url = server.url("stall/9000/shard-003.tar")
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        from spindle import _core
        o = _core.ShardOptions(); o.cache_dir = {str(cache)!r}; o.timeout = 60.0
        for _ in _core.WebDataset([{url!r}], o).iter_shard(0): pass
    """)])
    try:
        deadline = time.monotonic() + 60
        while not (cache.exists() and any(p.startswith(".") for p in os.listdir(cache))):
            assert time.monotonic() < deadline and child.poll() is None, "the child never started caching"
            time.sleep(0.05)
        time.sleep(0.3)  # some bytes written into the part file
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    parts = [p for p in os.listdir(cache) if p.startswith(".")]
    assert parts and cached_files(cache) == []
    assert os.path.getsize(cache / parts[0]) > 0
    # A good URL for the same shard name: the dead job's part file goes, the whole shard is kept.
    assert samples_of([server.url("shard-003.tar")], cache_dir=str(cache)) == samples_of(shards[3:])
    assert [p for p in os.listdir(cache) if p.startswith(".")] == []
    (kept,) = cached_files(cache)
    assert (cache / kept).read_bytes() == open(shards[3], "rb").read()
