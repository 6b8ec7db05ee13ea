"""Renders the figures of docs/benchmarks.md from bench/results/*.json.

    python bench/report_docs.py            # rewrites the generated parts of docs/benchmarks.md
    python bench/report_docs.py --check    # exits 1, naming the parts, when they differ from the JSON

Each generated part answers one question with one table, the command that produced the JSON
beside it. A part sits between `<!-- generated: NAME -->` and `<!-- end generated: NAME -->`;
everything outside the markers is written by hand. tests/python/test_docs.py runs the check,
so a result file committed without its page (or the reverse) fails the docs test.

Only the standard library: the docs test runs it without the benchmarks' dependencies.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"


def load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def rate(x: float) -> str:
    """Samples per second as the tables write them: 1,208k, 41.5k, 4,848, 67."""
    if x >= 1_000_000:
        return f"{x / 1000:,.0f}k"
    if x >= 10_000:
        return f"{x / 1000:.1f}k"
    return f"{x:,.0f}"


def ratio(x: float) -> str:
    return f"{x:.2f}x"


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def command(text: str) -> str:
    """The recorded command without this machine's paths: an interpreter path becomes `python`
    (`.venv-peers/bin/python` for peers' venvs), an absolute `--out` or `--root` becomes `DIR`."""
    text = re.sub(r"\S*venv-peers/bin/python", ".venv-peers/bin/python", text)
    text = re.sub(r"--peer-python \S+", "--peer-python .venv-peers/bin/python", text)
    text = re.sub(r"(?<!\S)(?:<venv>|/)\S*/bin/python3?", "python", text)
    text = re.sub(r"--(out|root) (?:/|<)\S+", r"--\1 DIR", text)
    return text


def machine(m: dict[str, Any], keys: tuple[str, ...] = ("numpy", "torch")) -> str:
    versions = m.get("versions") or {k: m.get(k) for k in keys}
    peers = ", ".join(f"{k} {versions[k]}" for k in keys if versions.get(k))
    return (f"{m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total_gib']} GiB, Python {m['python']}"
            + (f"; {peers}" if peers else ""))


REFERENCE_KEYS = ("numpy", "torch", "torchdata", "grain", "jax", "PIL")


def reference_machine() -> dict[str, Any]:
    """The machine of the page's first table (spindle bench's arrays run)."""
    return load("spindle-bench/bench.json")["machine"]


def same_machine(m: dict[str, Any], keys: tuple[str, ...]) -> bool:
    """Whether `m` is the reference machine with the same version of every package the table names."""
    ref = reference_machine()
    if any(m.get(k) != ref.get(k) for k in ("nproc", "cpu_model", "mem_total_gib", "python")):
        return False
    mine = m.get("versions") or {k: m.get(k) for k in keys}
    theirs = ref.get("versions") or {k: ref.get(k) for k in REFERENCE_KEYS}
    return all(mine.get(k) == theirs.get(k) for k in keys if mine.get(k))


def with_command(cmd: str, m: dict[str, Any] | None, body: str, keys: tuple[str, ...] = ("numpy", "torch"),
                 reference: bool = False) -> str:
    """The command, then the machine unless it is the first table's (the page says so once), then the table."""
    head = f"    {command(cmd)}\n"
    if m is not None and (reference or not same_machine(m, keys)):
        head += f"\nMachine: {machine(m, keys)}.\n"
    return head + "\n" + body


# --- one function per question -------------------------------------------------------------

def spindle_bench(workload: str) -> Callable[[], str]:
    """One row per loader, at 2 and at 16 workers side by side (every count: bench.md)."""
    def render() -> str:
        d = load("spindle-bench/bench.json")
        at: dict[str, dict[int, dict[str, Any]]] = {}
        for r in d["results"]:
            if r["workload"] == workload and r["workers"] in (2, 16):
                at.setdefault(r["loader"], {})[r["workers"]] = r

        def cell(loader: str, workers: int, key: str, fmt: Callable[[Any], str]) -> str:
            r = at[loader].get(workers)
            return fmt(r[key]) if r else "—"

        rows = [[loader] + [cell(loader, w, key, fmt) for key, fmt in (
            ("samples_per_s", rate), ("steady_samples_per_s", rate), ("first_batch_s", lambda x: f"{x:.2f}"),
            ("peak_threads", str), ("peak_pss_mib", lambda x: f"{x:.0f}"), ("cpu_s_per_1000", lambda x: f"{x:.3f}"))
            for w in (2, 16)] for loader in at]
        # key by key, each at 2 then at 16 workers ("@2", "@16"), as the cells above run
        header = ["loader"] + [f"{name}@{w}" for name in ("samples/s", "steady/s", "first-batch-s", "threads",
                                                         "PSS-MiB", "CPU-s/1k") for w in (2, 16)]
        body = table(header, rows)
        if workload == "arrays":
            return with_command(d["command"], d["machine"], body, REFERENCE_KEYS, reference=True)
        return body
    return render


def spindle_bench_ulimit() -> str:
    d = load("spindle-bench-ulimit/bench.json")
    rows = []
    for r in d["runs"]:
        error = (r.get("error") or "").split(". budget=")[0]
        rows.append([r["loader"], r["outcome"], r["ulimit_u"], r["uid_tasks_peak"], f"{r['wall_s']:.1f}",
                     f"`{error}`" if error else "—"])
    return with_command(d["command"], None, table(
        ["loader", "outcome", "ulimit -u", "peak tasks of the uid", "seconds", "error"], rows))


def dropin() -> str:
    d = load("dropin.json")
    rows = [[f"`{name}`", rate(s["median_samples_per_s"]), pct(s["fraction_of_limit"]), ratio(s["vs_torch"]),
             f"{s['worker_cpu_ns_per_sample']:,.0f} ns", f"{s['consumer_cpu_ns_per_sample']:,.0f} ns",
             pct(s["dataset_share_of_cpu"])] for name, s in d["summary"].items()]
    body = table(["loader", "samples/s", "of the limit", "vs torch", "worker CPU / sample",
                  "consumer CPU / sample", "dataset's share of the CPU"], rows)
    body += (f"\n\nLimit: 2 × one process's `dataset[i]` rate ({rate(d['one_process_rate'])}/s, "
             f"{d['one_process_cpu_ns_per_sample']:,.0f} ns CPU each) = {rate(d['limit_2_workers'])}/s; "
             f"over a stream, 2 × {rate(d['one_process_stream_rate'])}/s.")
    return with_command("python bench/python/dropin_bench.py --rounds 15", d["machine"], body)


def first_batch() -> str:
    d = load("dropin_ttfb.json")
    rows = [[case, f"{v['spindle.torch.DataLoader'] * 1000:.0f} ms", f"{v['torch.utils.data.DataLoader'] * 1000:.0f} ms"]
            for case, v in d["first_batch_seconds"].items()]
    body = table(["case (65,536 samples unless said)", "spindle.torch", "torch"], rows)
    return with_command("python bench/python/dropin_bench.py --rounds 7 --out dropin_ttfb", d["machine"], body)


def native(name: str) -> Callable[[], str]:
    def render() -> str:
        d = load(name)
        rows = [[loader, rate(s["median_images_per_s"]), ratio(s["vs_torch_pil"]), pct(s["fraction_of_limit"]),
                 s["peak_threads"]] for loader, s in d["summary"].items()]
        body = table(["loader", "images/s", "vs torch+PIL", "of the limit", "peak threads"], rows)
        body += (f"\n\nWorkload: {d['workload']}. Limit: 2 × one arena thread's rate of the same fused "
                 f"work ({rate(d['one_thread_rate'])}/s).")
        # the results file the command names is the one this table reads
        cmd = re.sub(r"--out [\w-]+\b", f"--out {Path(name).stem}", d["command"])
        return with_command(cmd, d["machine"], body, ("torch", "torchvision", "tensorflow", "spdl", "PIL"))
    return render


def captions() -> str:
    d = load("captions.json")
    rows = [[loader, rate(s["median_samples_per_s"]), ratio(s["vs_webdataset_pil"]), d["caption_bytes"][loader]]
            for loader, s in d["summary"].items()]
    body = table(["loader", "samples/s", "vs webdataset+PIL", "caption bytes delivered"], rows)
    body += f"\n\nWorkload: {d['workload']}."
    return with_command(d["command"], d["machine"], body)


def streaming() -> str:
    d = load("streaming.json")
    h, s = d["http_vs_local"], d["stats_overhead"]
    rows = [[f"{h['images']} JPEGs in {h['shards']} WebDataset shards, native ImageNet recipe, {h['workers']} workers",
             f"local disk: {rate(h['local_rate'])} img/s, {h['local_peak_threads']} threads",
             f"loopback HTTP: {rate(h['http_rate'])} img/s, {h['http_peak_threads']} threads",
             f"{pct(h['ratio'])} of local"],
            [f"{s['workload']}, {s['workers']} workers: statistics off (`SPINDLE_STATS=0`) / on",
             f"off: {rate(s['off_rate'])} samples/s", f"on: {rate(s['on_rate'])} samples/s",
             f"{100 * s['overhead']:+.2f}% cost"]]
    return with_command(d["command"], d["machine"], table(["question", "side A", "side B", "B against A"], rows))


def mix() -> str:
    d = load("mix.json")
    names = list(d["samples_per_s_median"])
    rel = {names[1]: d["mixed_over_unmixed"], names[2]: d["by_getitem_over_unmixed"]}
    rows = [[n, rate(d["samples_per_s_median"][n]), f"{rel.get(n, 1.0):.3f}",
             f"{d['worker_cpu_ns_per_sample_median'][n]:,} ns", f"{d['consumer_cpu_ns_per_sample_median'][n]} ns"]
            for n in names]
    body = table(["loader", f"samples/s (median of {d['rounds']} rounds)", "vs unmixed", "worker CPU / sample",
                  "consumer CPU / sample"], rows)
    return with_command(f"python bench/python/mix_bench.py --rounds {d['rounds']}", d["machine"], body)


def transport() -> str:
    d = load("transport.json")
    rows = [[f"`{name}`", p["description"], rate(p["median_samples_per_s"]), rate(p["median_steady_samples_per_s"]),
             f"{p['median_first_batch_ms']:.1f} ms"] for name, p in d["peers"].items()]
    rows += [[f"**{name}**", "ratio", ratio(r["median"]), ratio(r["steady"]), ""] for name, r in d["ratios"].items()]
    return with_command("python bench/python/transport_bench.py", d["machine"],
                        table(["peer", "loader", "samples/s (median)", "steady", "first batch"], rows))


def grain_jax() -> str:
    d = load("grain.json")
    rows = []
    for api, res in d["results"].items():
        for peer, p in res.items():
            if not isinstance(p, dict) or "summary" not in p:
                continue
            s = p["summary"]
            rows.append([f"`{peer}`", s["peak_tree_threads"], s["peak_tree_processes"],
                         "–".join(sorted({str(min(s["threads_per_worker_seen"])), str(max(s["threads_per_worker_seen"]))},
                                         key=int)),
                         rate(s["median_samples_per_s"]), rate(s["median_steady_samples_per_s"]),
                         f"{s['median_first_batch_s']:.2f} s", "yes" if res["values_equal"] else "no"])
    body = table(["peer", "peak threads of the tree", "processes", "threads per worker", "samples/s", "steady/s",
                  "first batch", "same elements as grain"], rows)
    return with_command("python bench/python/grain_bench.py", d["machine"], body,
                        ("numpy", "grain", "jax"))


def collate() -> str:
    d = load("collate.json")
    keys = ["spindle.torch samples/s", "torch samples/s", "spindle / torch", "spindle / spindle with None"]
    rows = [[f"`{r['collate_fn']}`", rate(r[keys[0]]), rate(r[keys[1]]), ratio(r[keys[2]]), ratio(r[keys[3]])]
            for r in d["table"]]
    body = table(["collate_fn", "spindle.torch samples/s", "torch samples/s", "vs torch",
                  "vs spindle.torch with `None`"], rows)
    return with_command("python bench/python/collate_bench.py", d["machine"], body)


def memory() -> str:
    d = load("memory.json")
    rows = [[r["dataset"], r["workers"], r["loader"], f"{r['consumer_pss_mib']:.0f}", f"{r['peak_tree_pss_mib']:.0f}",
             ratio(r["ratio"]), f"{r['worker_uss_mib']:.1f}"] for r in d["memory"]]
    body = table(["dataset", "workers", "loader", "consumer MiB", "peak tree MiB", "ratio", "worker USS MiB"], rows)
    return with_command(d["command"], d["machine"], body)


def memory_spawn() -> str:
    """One row per loader, its rounds side by side (the JSON lists them round after round)."""
    d = load("memory.json")
    rounds: dict[str, list[str]] = {}
    for r in d["spawn"]:
        rounds.setdefault(r["loader"], []).append(f"{r['first_batch_s']:.1f} s")
    first = d["spawn"][0]
    n = max(len(v) for v in rounds.values())
    rows = [[loader] + v + [""] * (n - len(v)) for loader, v in rounds.items()]
    return table([f"loader ({first['samples']:,} paths, {first['workers']} workers, spawn)"]
                 + [f"first batch, round {k + 1}" for k in range(n)], rows)


def ops() -> str:
    d = load("ops.json")
    rows = [[k, f"{v:,.0f}"] for k, v in d["samples_per_cpu_second"].items()]
    body = table([f"{d['files']} files of {d['image']}: decode + random-resized-crop 224 + flip", "images per CPU-second"],
                 rows)
    return with_command("python bench/python/ops_bench.py", d["machine"], body)


def reseed() -> str:
    d = load("reseed.json")
    rows = [[k, f"{v:.2f} µs", f"{d['added_us_per_sample'][k]:.2f} µs"] for k, v in d["us_per_sample"].items()]
    return with_command("python bench/python/reseed_bench.py", d["machine"],
                        table(["per sample", "time", "added by reseeding"], rows))


def soak() -> str:
    d = load("soak.json")
    rows = [[k, v] for k, v in d["epochs"].items()]
    body = table([f"loader ({d['minutes']:.0f} minutes, back to back)", "epochs"], rows)
    drift = ", ".join(f"{k} {v:.1f} (allowed {d['slack'][k]})" for k, v in d["drift"].items())
    body += (f"\n\nDrift from the first sample to the last: {drift}. Errors: {len(d['errors'])}. "
             f"Flat: {'yes' if d['flat'] else 'no'}; nothing left after close: "
             f"{'yes' if d['clean_after_close'] else 'no'}.")
    return with_command("python bench/python/soak.py --minutes 60", None, body)


SECTIONS: dict[str, Callable[[], str]] = {
    "spindle-bench-arrays": spindle_bench("arrays"),
    "spindle-bench-jpeg-pil": spindle_bench("jpeg-pil"),
    "spindle-bench-jpeg-native": spindle_bench("jpeg-native"),
    "spindle-bench-ulimit": spindle_bench_ulimit,
    "dropin": dropin,
    "first-batch": first_batch,
    "transport": transport,
    "grain-jax": grain_jax,
    "native": native("native.json"),
    "native-jitter": native("native-jitter.json"),
    "captions": captions,
    "streaming": streaming,
    "mix": mix,
    "collate": collate,
    "memory": memory,
    "memory-spawn": memory_spawn,
    "ops": ops,
    "reseed": reseed,
    "soak": soak,
}

PART = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)", re.S)


def render(text: str) -> str:
    """The page with every generated part rendered again; a part the page names but this script
    does not know, or a known part the page lacks, is an error."""
    seen = set()

    def part(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in SECTIONS:
            raise SystemExit(f"report_docs: docs/benchmarks.md has a part {name!r} this script does not render")
        seen.add(name)
        return match.group(1) + SECTIONS[name]() + "\n" + match.group(4)

    out = PART.sub(part, text)
    missing = set(SECTIONS) - seen
    if missing:
        raise SystemExit(f"report_docs: docs/benchmarks.md lacks the parts {sorted(missing)}; add their markers")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page differs from the JSON")
    args = parser.parse_args(argv)
    text = PAGE.read_text()
    new = render(text)
    if args.check:
        if new != text:
            stale = [m.group("name") for m, n in zip(PART.finditer(text), PART.finditer(new)) if m.group(0) != n.group(0)]
            print("docs/benchmarks.md is out of date with bench/results in: " + ", ".join(stale)
                  + "\nrun: python bench/report_docs.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
