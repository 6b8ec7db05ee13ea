"""``spindle bench``: every loader on identical workloads, each in its own process tree.

    spindle bench --quick                       # about a minute on 2 cores
    spindle bench --workload arrays,jpeg-pil --workers 1,2,4,8,16 --rounds 3
    spindle bench --dataset mypkg.data:make_train_set --loaders spindle,torch
    spindle bench --ulimit 24 --workers 16      # as uid 65534 with 24 tasks of headroom (root only)

For each workload, loader and worker count: samples/s (median and spread over rounds),
time to first batch, peak threads, processes and PSS of the whole tree, CPU seconds per
1,000 samples; then a table, JSON, one PNG per workload, and the worker count that reaches
the best rate within this node's thread budget. A peer that does not import is skipped
with the reason, never faked. Modules: ``tree`` (measuring a process tree from /proc),
``child`` (one loader, one epoch), ``harness`` (the grid), ``report`` (table, plots, advice),
``workloads`` (the datasets), ``machine`` (what every result records).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Optional

from .._extras import MissingExtraError, missing_modules, require_extra
from . import harness, report
from .machine import machine_info
from .tree import load_average

__all__ = ["main"]

QUICK_LOADERS = ("spindle", "torch", "torch+PIL", "spindle-native-processes", "spindle-native-threads")


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _workers(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in _csv(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers wants a comma-separated list of counts, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"--workers wants counts >= 0, got {text!r}")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spindle bench", description=__doc__.split("\n\n")[0].replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="workloads: arrays (transport-bound 64x64x3 uint8), jpeg-pil (PIL decode + random-resized-crop "
               "224 + flip in Python), jpeg-native (the same in each loader's native ops), dataset (--dataset).\n"
               f"loaders: {', '.join(harness.LOADER_MODULES)}.")
    p.add_argument("--workload", type=_csv, help="comma-separated workloads (default arrays,jpeg-pil,jpeg-native; "
                   "--quick: arrays,jpeg-native; with --dataset: dataset)")
    p.add_argument("--loaders", type=_csv, help="comma-separated loaders (default: all that apply to the workload; "
                   f"--quick: {','.join(QUICK_LOADERS)})")
    p.add_argument("--workers", type=_workers, help="comma-separated worker counts (default 1,2,4,8,16; --quick 1,2; "
                   "--ulimit 16)")
    p.add_argument("--rounds", type=int, help="epochs per loader and worker count, alternating (default 3; "
                   "--quick 2; --ulimit 1)")
    p.add_argument("--samples", type=int, help="samples of the arrays workload (default 65536; --quick 16384)")
    p.add_argument("--images", type=int, help="JPEGs in the generated folder (default 2000; --quick 256)")
    p.add_argument("--root", help="image folder in ImageNet layout (default: one generated under /tmp)")
    p.add_argument("--dataset", metavar="MODULE:FACTORY", help="your own map-style dataset: FACTORY() from MODULE")
    p.add_argument("--ulimit", type=int, metavar="HEADROOM", dest="ulimit_headroom",
                   help="run each loader as uid 65534 under ulimit -u = its tasks + 1 + HEADROOM (needs root and "
                        "setpriv); report who completes and how each failure reads")
    p.add_argument("--peer-python", metavar="PYTHON", help="another interpreter (a venv with tensorflow or spdl, "
                   "say) for the peers that do not import in this one; spindle's loaders stay here")
    p.add_argument("--timeout", type=int, default=240, help="seconds one epoch may take before it counts as a "
                   "hang (default 240)")
    p.add_argument("--out", default="spindle-bench", help="folder for bench.json and the plots (default "
                   "./spindle-bench)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout (the table goes "
                   "to stderr)")
    p.add_argument("--quick", action="store_true", help="a short grid: about a minute on 2 cores")
    p.add_argument("--no-plot", action="store_true", help="no PNGs")
    return p


def settings_from(args: argparse.Namespace) -> harness.Settings:
    q = args.quick
    workloads = args.workload or (("dataset",) if args.dataset else ("arrays", "jpeg-native") if q
                                  else ("arrays", "jpeg-pil", "jpeg-native"))
    for w in workloads:
        if w not in harness.WORKLOAD_LOADERS:
            raise SystemExit(f"spindle bench: unknown workload {w!r}; one of {', '.join(harness.WORKLOAD_LOADERS)}")
    if "dataset" in workloads and not args.dataset:
        raise SystemExit("spindle bench: the dataset workload needs --dataset MODULE:FACTORY")
    loaders = args.loaders or (QUICK_LOADERS if q else tuple(harness.LOADER_MODULES))
    for name in loaders:
        if name not in harness.LOADER_MODULES:
            raise SystemExit(f"spindle bench: unknown loader {name!r}; one of {', '.join(harness.LOADER_MODULES)}")
    uid_mode = args.ulimit_headroom is not None
    workers = args.workers or ((16,) if uid_mode else (1, 2) if q else (1, 2, 4, 8, 16))
    images = args.images or (256 if q else 2000)
    return harness.Settings(
        workloads=tuple(workloads), loaders=tuple(loaders), workers=tuple(workers),
        rounds=args.rounds or (1 if uid_mode else 2 if q else 3), samples=args.samples or (16384 if q else 65536),
        images=images, root=args.root or f"/tmp/spindle-bench-imagenet-{images}", dataset=args.dataset,
        alarm_s=args.timeout, kill_after_s=args.timeout + 30, peer_python=args.peer_python,
        ulimit_headroom=args.ulimit_headroom)


class _Progress:
    """tqdm on stderr when it is installed, else one line per measurement."""

    def __init__(self, total: int) -> None:
        try:
            from tqdm import tqdm

            self._bar: Any = tqdm(total=total, file=sys.stderr, unit="run", dynamic_ncols=True)
        except ImportError:
            self._bar, self._done, self._total = None, 0, total

    def step(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)
            self._bar.update(1)
        else:
            self._done += 1
            print(f"[{self._done}/{self._total}] {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def plan(s: harness.Settings) -> list[tuple[str, str, int]]:
    """(workload, loader, workers) in run order: per round, per worker count, every loader, the
    loaders' order rotated by one each round."""
    order: list[tuple[str, str, int]] = []
    for r in range(s.rounds):
        for workload in s.workloads:
            loaders = [x for x in s.loaders if x in harness.WORKLOAD_LOADERS[workload]]
            if not loaders:
                continue
            k = r % len(loaders)
            loaders = loaders[k:] + loaders[:k]
            for w in s.workers:
                order.extend((workload, name, w) for name in loaders
                             if not (w == 0 and name.startswith("spindle-native")))
    return order


def _write_results(out_dir: Path, doc: dict[str, Any], s: harness.Settings) -> None:
    """bench.json and bench.md of `doc` into `out_dir`."""
    (out_dir / "bench.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out_dir / "bench.md").write_text(report.format_markdown(doc) if s.ulimit_headroom is None
                                      else report.format_ulimit_markdown(doc))


def main(argv: Optional[list[str]] = None) -> int:
    """Runs ``spindle bench``; returns the exit status."""
    args = parser().parse_args(argv)
    s = settings_from(args)
    text_out = sys.stderr if args.json else sys.stdout
    # What the 'bench' extra brings, checked before any work: pillow makes and decodes the JPEGs
    # of the jpeg workloads (no way around it); matplotlib only draws the plots, so without it
    # the bench runs and says so; tqdm only draws the progress bar.
    jpeg = [w for w in s.workloads if w.startswith("jpeg")]
    if jpeg:
        try:
            require_extra("bench", ("PIL",), f"spindle bench's {'/'.join(jpeg)} workload")
        except MissingExtraError as e:
            print(f"{e} (or --workload arrays, which needs none)", file=sys.stderr)
            return 2
    want_plots = not args.no_plot and s.ulimit_headroom is None
    if want_plots and missing_modules(("matplotlib",)):
        print("spindle bench: matplotlib is not installed, so no plots (the table, bench.json and bench.md are "
              "written): pip install 'spindle[bench]'", file=sys.stderr)
        want_plots = False
    if s.ulimit_headroom is not None and (os.geteuid() != 0 or shutil.which("setpriv") is None):
        print("spindle bench --ulimit needs root and setpriv (util-linux): it runs each loader as uid 65534; "
              "root itself is exempt from ulimit -u", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    try:  # an --out that cannot be written fails now, not after the epochs
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"spindle bench: cannot write results to --out {out_dir}: {e}", file=sys.stderr)
        return 2
    if jpeg and args.root is None:
        from .workloads import make_image_folder

        print(f"image folder: {s.root} ({s.images} generated JPEGs)", file=sys.stderr, flush=True)
        make_image_folder(s.root, s.images)
    # Run from a spindle checkout, the results also name its commit and what changed since the build.
    repo = Path.cwd() if (Path.cwd() / "runtime").is_dir() and (Path.cwd() / "python" / "spindle").is_dir() else None
    started = time.time()
    info = machine_info(repo, s.peer_python)
    staging = harness.Staging()
    runs: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    interrupted: Optional[str] = None
    try:
        skipped = harness.find_loaders(s, staging)
        s.loaders = tuple(x for x in s.loaders if x not in skipped)
        order = plan(s)
        print(f"spindle bench: {len(order)} epochs ({', '.join(s.workloads)}; workers {s.workers}; "
              f"{s.rounds} rounds); load average {info['load_average_at_start']} on {info['nproc']} CPUs",
              file=sys.stderr, flush=True)
        progress = _Progress(len(order))
        with (harness.uid_lock() if s.ulimit_headroom is not None else contextlib.nullcontext()):
            for workload, name, w in order:
                r = harness.run_one(workload, name, w, s, staging)
                runs.append(r)
                progress.step(f"{workload} {name} w={w}: " + (
                    f"{r['samples_per_s']:,.0f}/s" if r.get("outcome") == "completed" else r.get("outcome", "?")))
        progress.close()
    except KeyboardInterrupt:  # the epochs measured so far are still written
        interrupted = f"interrupted (Ctrl-C) after {len(runs)} epochs"
        print(f"\nspindle bench: {interrupted}; writing what was measured", file=sys.stderr)
    finally:
        staging.close()
    rows = report.aggregate(runs)
    budget = ({"budget": s.ulimit_headroom, "source": "--ulimit headroom"} if s.ulimit_headroom is not None
              else report.node_budget())
    advice = report.advice(rows, budget["budget"])
    end_load = load_average()
    meta = (f"{info['nproc']} CPUs, load {info['load_average_at_start'][0]}->{end_load[0]}, "
            f"{info['date'][:16]}Z")
    doc = {"command": "spindle bench " + " ".join(argv if argv is not None else sys.argv[1:]),
           "settings": {k: v for k, v in vars(s).items()}, "machine": info,
           "load_average_at_end": end_load, "wall_s": round(time.time() - started, 1),
           "skipped": skipped, "results": rows, "advice": advice, "node_budget": budget,
           "plots": [], "runs": runs}
    if interrupted:
        doc["interrupted"] = interrupted
    # The measurements are on disk before anything that can still fail (the plots): bench.json is
    # written again only to add the plots' names.
    _write_results(out_dir, doc, s)
    plots: list[Path] = []
    if want_plots:
        try:
            plots = report.plot(rows, out_dir, meta)
        except Exception as e:  # noqa: BLE001 - a plot never costs the results
            print(f"spindle bench: no plots ({type(e).__name__}: {e}); the results are in {out_dir / 'bench.json'}",
                  file=sys.stderr)
        if plots:
            doc["plots"] = [str(p) for p in plots]
            _write_results(out_dir, doc, s)
    if s.ulimit_headroom is not None:
        text_out.write(report.format_ulimit_table(runs))
        if skipped:
            text_out.write("skipped (not faked):\n" + "".join(f"  {k}: {v}\n" for k, v in skipped.items()))
    else:
        text_out.write(report.format_table(rows, skipped))
        text_out.write(report.format_advice(advice, budget))
    text_out.write(f"\nload average {info['load_average_at_start']} at the start, {end_load} at the end "
                   f"({info['nproc']} CPUs); results: {out_dir / 'bench.json'}"
                   + "".join(f"\nplot: {p}" for p in plots) + "\n")
    if args.json:
        json.dump(doc, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    return 130 if interrupted else 0
