"""The ``spindle`` command (``python -m spindle`` too): ``doctor`` and ``bench``."""

from __future__ import annotations

import argparse
import json
import sys


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("spindle")
    except PackageNotFoundError:  # imported from a source tree, not installed
        return "(not installed)"


def main(argv: list[str] | None = None) -> int:
    """Runs ``spindle <command>``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="spindle", description="spindle's command line tools.")
    parser.add_argument("--version", action="version", version=f"spindle {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    doctor = commands.add_parser(
        "doctor",
        help="show the task limits (ulimit -u, cgroup pids.max, threads-max), who uses them, and how to cut "
             "each thread pool found",
        description="Limits that make fork and pthread_create fail, the tasks of this uid, the headroom, and "
                    "every process of this uid (or PID) with its threads grouped by runtime, with advice.")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument("--pid", type=int, metavar="PID",
                        help="only this process and its spindle workers (limits and use are then those of its "
                             "uid and cgroup)")
    commands.add_parser(
        "bench", add_help=False,
        help="run loaders (spindle, torch, torchdata, grain, tf.data, SPDL) side by side on identical workloads: "
             "samples/s, first batch, threads, processes, PSS, CPU per sample; table, JSON, plots, advice "
             "(spindle bench --help)")
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from .bench import main as bench_main

        return bench_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")

    from . import doctor as doctor_module  # imports spindle's extension; after argument errors

    try:
        report = doctor_module.collect(args.pid)
    except ProcessLookupError as e:
        print(e, file=sys.stderr)
        return 1
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(doctor_module.format_text(report))
    return 0
