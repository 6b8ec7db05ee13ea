"""The ``spindle`` command (``python -m spindle`` too). One subcommand: ``doctor``."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    """Runs ``spindle <command>``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="spindle", description="spindle's command line tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    doctor = commands.add_parser(
        "doctor",
        help="show the task limits (ulimit -u, cgroup pids.max, threads-max), who uses them, and how to cut "
             "each thread pool found",
        description="Limits that make fork and pthread_create fail, the tasks of this uid, the headroom, and "
                    "every process of this uid (or PID) with its threads grouped by runtime, with advice.")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument("--pid", type=int, metavar="PID",
                        help="only this process (limits and use are then those of its uid and cgroup)")
    args = parser.parse_args(argv)

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
