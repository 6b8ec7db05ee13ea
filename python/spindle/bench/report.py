"""From the runs to what a person reads: the table, the plots, the advice.

Per workload, loader and worker count: samples/s (median of the rounds and the spread,
(max - min) / median), the steady rate after the first batch, time to first batch,
the peaks of the whole tree (threads, processes, PSS) and CPU seconds per 1,000 samples.
Only completed epochs give figures; a loader that failed says how.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Optional


def _median(values: list[float]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (workload, loader, workers), in the order they first ran."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["workload"], r["loader"], r["workers"]), []).append(r)
    rows = []
    for (workload, loader, workers), rs in groups.items():
        ok = [r for r in rs if r.get("outcome") == "completed"]
        row: dict[str, Any] = {"workload": workload, "loader": loader, "workers": workers, "rounds": len(rs),
                               "completed": len(ok)}
        if ok:
            rates = [r["samples_per_s"] for r in ok]
            med = statistics.median(rates)
            row.update(
                samples=ok[0]["samples"],
                samples_per_s=med, samples_per_s_min=min(rates), samples_per_s_max=max(rates),
                spread=(max(rates) - min(rates)) / med if med else None,
                steady_samples_per_s=_median([r.get("steady_samples_per_s") for r in ok]),
                first_batch_s=_median([r.get("first_batch_s") for r in ok]),
                peak_threads=max(r["peak_threads"] for r in ok),
                peak_processes=max(r["peak_processes"] for r in ok),
                peak_pss_mib=max(r["peak_pss_mib"] for r in ok),
                cpu_s_per_1000=_median([1000 * r["cpu_s"] / r["samples"] for r in ok if r.get("samples")]),
                consumer_threads_before=max(r.get("consumer_threads_before", 0) for r in ok),
                foreign_cpu_share_max=max(r.get("foreign_cpu_share", 0) for r in ok))
        failed = [r for r in rs if r.get("outcome") != "completed"]
        if failed:
            row["failures"] = [{"outcome": r.get("outcome"), "error": first_line(r.get("error", ""))}
                               for r in failed]
        rows.append(row)
    return rows


def first_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[0][:200] if lines else ""


def _fmt_rate(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e4 else f"{x:,.0f}"


def format_table(rows: list[dict[str, Any]], skipped: dict[str, str]) -> str:
    """The terminal table, one block per workload."""
    out = []
    head = (f"{'loader':26} {'workers':>7} {'samples/s':>10} {'spread':>7} {'steady/s':>9} {'1st batch':>9} "
            f"{'threads':>7} {'procs':>5} {'PSS MiB':>8} {'CPU-s/1k':>8}  ok")
    for workload in dict.fromkeys(r["workload"] for r in rows):
        out.append(f"\n{workload}")
        out.append(head)
        for r in (r for r in rows if r["workload"] == workload):
            if r["completed"]:
                out.append(f"{r['loader']:26} {r['workers']:>7} {_fmt_rate(r['samples_per_s']):>10} "
                           f"{100 * (r['spread'] or 0):>6.0f}% {_fmt_rate(r['steady_samples_per_s']):>9} "
                           f"{r['first_batch_s']:>8.3f}s {r['peak_threads']:>7} {r['peak_processes']:>5} "
                           f"{r['peak_pss_mib']:>8.0f} {r['cpu_s_per_1000']:>8.3f}  {r['completed']}/{r['rounds']}")
            for f in r.get("failures", [])[:1]:
                out.append(f"{r['loader']:26} {r['workers']:>7}  {f['outcome']}: {f['error']}"
                           + (f" ({len(r['failures'])} of {r['rounds']} rounds)" if r["rounds"] > 1 else ""))
    if skipped:
        out.append("\nskipped (not faked):")
        out.extend(f"  {name}: {why}" for name, why in skipped.items())
    return "\n".join(out) + "\n"


def format_ulimit_table(runs: list[dict[str, Any]]) -> str:
    """--ulimit mode: who completes as uid 65534 under the headroom, and how each failure reads."""
    out = [f"{'workload':12} {'loader':26} {'workers':>7} {'outcome':>10} {'ulimit -u':>9} {'peak uid tasks':>14} "
           f"{'seconds':>7}  error"]
    for r in runs:
        out.append(f"{r['workload']:12} {r['loader']:26} {r['workers']:>7} {r.get('outcome', '?'):>10} "
                   f"{r.get('ulimit_u', '?'):>9} {r.get('uid_tasks_peak', '?'):>14} {r.get('wall_s', 0):>7.1f}  "
                   f"{first_line(r.get('error', '')) if r.get('outcome') != 'completed' else ''}")
    return "\n".join(out) + "\n"


def node_budget() -> dict[str, Any]:
    """This node's task budget for this uid: spindle's ThreadBudget (ulimit -u, pids.max), or,
    where neither limits this uid (root), the kernel's threads-max less the tasks running now."""
    import spindle
    from spindle import _core

    b = spindle.ThreadBudget()
    if b.budget is not None:
        return {"budget": int(b.budget), "source": f"spindle.ThreadBudget(): {b!r}"}
    # /proc through the core's readers, as every other reader of the operating system's facts.
    threads_max = _core.sysctl_int("kernel.threads-max")
    if threads_max is None:
        return {"budget": None, "source": repr(b)}
    running = sum(_core.count_process_threads(p) for p in _core.process_ids())
    return {"budget": threads_max - running,
            "source": f"no ulimit -u or pids.max limits this uid: kernel.threads-max {threads_max} less "
                      f"{running} tasks running"}


def advice(rows: list[dict[str, Any]], budget: Optional[int]) -> list[dict[str, Any]]:
    """Per workload and loader: the worker count of the best median rate among those whose tree
    fits the budget, and the fewest workers within 5% of it."""
    out = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        for loader in dict.fromkeys(r["loader"] for r in rows if r["workload"] == workload):
            done = [r for r in rows if r["workload"] == workload and r["loader"] == loader and r["completed"]]
            fits = [r for r in done if budget is None or r["peak_threads"] <= budget]
            if not fits:
                if done:
                    out.append({"workload": workload, "loader": loader, "fits": False,
                                "text": f"no measured worker count fits {budget} tasks "
                                        f"(fewest threads: {min(r['peak_threads'] for r in done)})"})
                continue
            best = max(fits, key=lambda r: r["samples_per_s"])
            enough = min((r for r in fits if r["samples_per_s"] >= 0.95 * best["samples_per_s"]),
                         key=lambda r: r["workers"])
            out.append({"workload": workload, "loader": loader, "fits": True, "workers": best["workers"],
                        "samples_per_s": best["samples_per_s"], "peak_threads": best["peak_threads"],
                        "workers_within_5pct": enough["workers"],
                        "text": f"{_workers_text(best['workers'])}: {_fmt_rate(best['samples_per_s'])} samples/s, "
                                f"{best['peak_threads']} threads"
                                + (f" ({_workers_text(enough['workers'])} reach{'es' if enough['workers'] == 1 else ''} "
                                   f"95% of it with "
                                   f"{enough['peak_threads']} threads)" if enough is not best else "")})
    return out


def _workers_text(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"


def format_advice(items: list[dict[str, Any]], budget: dict[str, Any]) -> str:
    out = [f"\nadvice (thread budget of this node: {budget['budget']} tasks; {budget['source']}):"]
    for workload in dict.fromkeys(a["workload"] for a in items):
        mine = [a for a in items if a["workload"] == workload]
        fitting = [a for a in mine if a["fits"]]
        if fitting:
            top = max(fitting, key=lambda a: a["samples_per_s"])
            out.append(f"  {workload}: best within the budget: {top['loader']} with {_workers_text(top['workers'])} "
                       f"({_fmt_rate(top['samples_per_s'])} samples/s, {top['peak_threads']} threads)")
        out.extend(f"    {a['loader']:26} {a['text']}" for a in mine)
    return "\n".join(out) + "\n"


def plot(rows: list[dict[str, Any]], out_dir: Path, meta: str) -> list[Path]:
    """One PNG per workload: samples/s and peak threads of the tree against workers, a line per loader."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == workload and r["completed"]]
        if not mine:
            continue
        fig, (ax_rate, ax_threads) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=80)
        for loader in dict.fromkeys(r["loader"] for r in mine):
            pts = sorted((r for r in mine if r["loader"] == loader), key=lambda r: r["workers"])
            xs = [r["workers"] for r in pts]
            style = "-o" if loader.startswith("spindle") else "--s"
            ax_rate.errorbar(xs, [r["samples_per_s"] for r in pts],
                             yerr=[[r["samples_per_s"] - r["samples_per_s_min"] for r in pts],
                                   [r["samples_per_s_max"] - r["samples_per_s"] for r in pts]],
                             fmt=style, capsize=3, label=loader)
            ax_threads.plot(xs, [r["peak_threads"] for r in pts], style, label=loader)
        for ax, title in ((ax_rate, "samples/s (median, min-max of rounds)"),
                          (ax_threads, "peak threads of the loader's process tree")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r["workers"] for r in mine}), [str(w) for w in sorted({r["workers"] for r in mine})])
            ax.set_xlabel("workers")
            ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3)
        rates = [r["samples_per_s_min"] for r in mine] + [r["samples_per_s_max"] for r in mine]
        if max(rates) > 20 * min(rates):  # loaders an order of magnitude apart: a log axis shows both
            ax_rate.set_yscale("log")
        else:
            ax_rate.set_ylim(bottom=0)
        ax_threads.set_ylim(bottom=0)
        ax_threads.legend(fontsize=8, loc="upper left")
        fig.suptitle(f"spindle bench: {workload}  ({meta})", fontsize=9)
        fig.tight_layout()
        path = out_dir / f"bench-{workload}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def format_markdown(doc: dict[str, Any]) -> str:
    """The results as Markdown (bench.md beside bench.json): what docs/benchmarks.md's top part pastes."""
    m = doc["machine"]
    v = m.get("versions", {})
    peers = ", ".join(f"{k} {x}" for k, x in v.items() if x) or "?"
    out = [f"Command: `{doc['command']}`", "",
           f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['mem_total_gib']} GiB, Linux {m['kernel']}, "
           f"Python {m['python']}; {peers}."]
    if m.get("peer_versions"):
        pv = ", ".join(f"{k} {x}" for k, x in m["peer_versions"].items() if x)
        out.append(f"Peers not importable here ran in `{m['peer_python']}`: {pv}.")
    foreign = [r.get("foreign_cpu_share", 0) for r in doc["runs"]]
    out.append(f"Date {m['date']}, git `{m.get('git', '?')}`, {doc['wall_s']:.0f} s in all. Load average "
               f"{m['load_average_at_start']} at the start, {doc['load_average_at_end']} at the end; other "
               f"processes took a median {100 * statistics.median(foreign) if foreign else 0:.0f}% (max "
               f"{100 * max(foreign) if foreign else 0:.0f}%) of the machine's CPU time during the runs.")
    out.append("")
    for workload in dict.fromkeys(r["workload"] for r in doc["results"]):
        out += [f"**{workload}**", "",
                "| loader | workers | samples/s (median) | min–max | steady/s | first batch | peak threads | "
                "processes | PSS MiB | CPU-s / 1k samples |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in (r for r in doc["results"] if r["workload"] == workload):
            if r["completed"]:
                out.append(f"| {r['loader']} | {r['workers']} | {_fmt_rate(r['samples_per_s'])} | "
                           f"{_fmt_rate(r['samples_per_s_min'])}–{_fmt_rate(r['samples_per_s_max'])} | "
                           f"{_fmt_rate(r['steady_samples_per_s'])} | {r['first_batch_s']:.3f} s | "
                           f"{r['peak_threads']} | {r['peak_processes']} | {r['peak_pss_mib']:.0f} | "
                           f"{r['cpu_s_per_1000']:.3f} |")
            for f in r.get("failures", [])[:1]:
                out.append(f"| {r['loader']} | {r['workers']} | {f['outcome']} ({len(r['failures'])} of "
                           f"{r['rounds']}): {f['error'].replace('|', '/')} | | | | | | | |")
        out.append("")
    if doc["skipped"]:
        out.append("Skipped (not faked): " + "; ".join(f"{k}: {x}" for k, x in doc["skipped"].items()) + ".")
        out.append("")
    b = doc["node_budget"]
    out.append(f"Advice (thread budget {b['budget']} tasks: {b['source']}):")
    out.append("")
    for a in doc["advice"]:
        out.append(f"- {a['workload']}, {a['loader']}: {a['text']}")
    return "\n".join(out) + "\n"


def format_ulimit_markdown(doc: dict[str, Any]) -> str:
    """--ulimit mode as Markdown: one row per loader, who completed and how each failure reads."""
    m = doc["machine"]
    out = [f"Command: `{doc['command']}` ({m['date']}, load average {m['load_average_at_start']} -> "
           f"{doc['load_average_at_end']})", "",
           "| workload | loader | workers | outcome | ulimit -u | peak tasks of the uid | seconds | how it failed |",
           "|---|---|---:|---|---:|---:|---:|---|"]
    for r in doc["runs"]:
        err = "" if r.get("outcome") == "completed" else first_line(r.get("error", "")).replace("|", "/")
        out.append(f"| {r['workload']} | {r['loader']} | {r['workers']} | {r.get('outcome')} | {r.get('ulimit_u')} | "
                   f"{r.get('uid_tasks_peak')} | {r.get('wall_s', 0):.1f} | {err} |")
    if doc["skipped"]:
        out += ["", "Skipped (not faked): " + "; ".join(f"{k}: {x}" for k, x in doc["skipped"].items()) + "."]
    return "\n".join(out) + "\n"
