"""Prometheus export of loader statistics (``pip install spindle[metrics]``).

``Collector`` turns the ``stats()`` of the loaders it is given into Prometheus metrics, labelled
by loader name, each time it is scraped::

    from prometheus_client import REGISTRY, start_http_server
    from spindle.metrics import Collector

    REGISTRY.register(Collector({"train": train_loader, "eval": eval_loader}))
    start_http_server(9400)

Metrics (see docs/observability.md):

- ``spindle_batches_total``, ``spindle_samples_total``, ``spindle_skipped_total``: counters;
- ``spindle_wait_seconds``: a summary of the time ``next()`` blocked per batch (``_count``,
  ``_sum``, quantiles 0.5 and 0.95);
- ``spindle_worker_busy_ratio``: per worker, busy time over the time since the loader started
  (or ``reset_stats()``);
- ``spindle_bytes_fetched_total``: bytes streamed from remote shards;
- ``spindle_ring_ready_batches``: batches ready and not yet taken (a full ring: the consumer is
  the bottleneck; an empty one: the workers are);
- ``spindle_worker_private_bytes``: per running worker, its USS (private memory: what it alone
  costs; docs/shared_memory.md);
- ``spindle_processes``, ``spindle_max_processes``: the worker processes running now and the most
  the loader may run (``num_workers="auto"`` changes the first within the second);
  ``spindle_processes_change_info``: 1, labelled with the ``reason`` of the last change (the
  INFO line's words); ``spindle_workers_replaced_total``: lost worker processes replaced
  (``on_worker_death="replace"``).

Importing ``spindle`` does not import this module or prometheus_client.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator, Mapping, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as _PrometheusCollector

__all__ = ["Collector"]


class Collector(_PrometheusCollector):
    """A prometheus_client collector over loaders that have ``stats()`` (spindle.DataLoader,
    spindle.torch.DataLoader, spindle.grain.DataLoader, spindle.PipelineLoader, or a runtime
    ``_core.Loader``), keyed by the name each gets as its ``loader`` label."""

    def __init__(self, loaders: Optional[Mapping[str, Any]] = None) -> None:
        self._lock = threading.Lock()
        self._loaders: dict[str, Any] = {}
        for name, loader in (loaders or {}).items():
            self.add(name, loader)

    def add(self, name: str, loader: Any) -> None:
        """Exports ``loader`` under ``loader="<name>"`` (replacing any loader of that name)."""
        if not callable(getattr(loader, "stats", None)):
            raise TypeError(f"spindle.metrics: {name!r} has no stats() method ({type(loader).__name__})")
        with self._lock:
            self._loaders[str(name)] = loader

    def remove(self, name: str) -> None:
        """Stops exporting the loader called ``name``."""
        with self._lock:
            self._loaders.pop(str(name), None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            loaders = list(self._loaders.items())
        batches = CounterMetricFamily("spindle_batches", "Batches delivered by next()", labels=["loader"])
        samples = CounterMetricFamily("spindle_samples", "Samples in the delivered batches", labels=["loader"])
        skipped = CounterMetricFamily("spindle_skipped", "Samples replaced by on_error='skip'", labels=["loader"])
        fetched = CounterMetricFamily("spindle_bytes_fetched", "Bytes streamed from remote shards",
                                      labels=["loader"])
        wait = Metric("spindle_wait_seconds", "Time next() blocked waiting for a batch", "summary")
        busy = GaugeMetricFamily("spindle_worker_busy_ratio", "Share of the time a worker spent producing batches",
                                 labels=["loader", "worker"])
        ready = GaugeMetricFamily("spindle_ring_ready_batches", "Batches ready in the ring, not yet taken",
                                  labels=["loader"])
        private = GaugeMetricFamily("spindle_worker_private_bytes", "A running worker's private memory (USS)",
                                    labels=["loader", "worker"])
        processes = GaugeMetricFamily("spindle_processes", "Worker processes running now", labels=["loader"])
        most = GaugeMetricFamily("spindle_max_processes", "The most worker processes the loader may run",
                                 labels=["loader"])
        change = GaugeMetricFamily("spindle_processes_change_info", "Why the worker processes last changed",
                                   labels=["loader", "reason"])
        replaced = CounterMetricFamily("spindle_workers_replaced", "Lost worker processes replaced",
                                       labels=["loader"])
        for name, loader in loaders:
            s = _stats_of(loader)
            processes.add_metric([name], s["processes"])
            most.add_metric([name], s["max_processes"])
            replaced.add_metric([name], s["replaced"])
            if s["resize_reason"]:
                change.add_metric([name, s["resize_reason"]], 1)
            batches.add_metric([name], s["batches"])
            samples.add_metric([name], s["samples"])
            skipped.add_metric([name], s["skipped"])
            fetched.add_metric([name], s["bytes_fetched"])
            for q, key in (("0.5", "wait_p50_ms"), ("0.95", "wait_p95_ms")):
                wait.add_sample("spindle_wait_seconds", {"loader": name, "quantile": q}, s[key] / 1e3)
            wait.add_sample("spindle_wait_seconds_count", {"loader": name}, s["batches"])
            wait.add_sample("spindle_wait_seconds_sum", {"loader": name}, s["wait_s"])
            elapsed = s["elapsed_s"]
            for w in s["workers"]:
                busy.add_metric([name, str(w["worker"])], w["busy_s"] / elapsed if elapsed > 0 else 0.0)
                if w.get("uss_bytes") is not None:
                    private.add_metric([name, str(w["worker"])], w["uss_bytes"])
            ready.add_metric([name], s["ring_ready"])
        yield from (batches, samples, skipped, fetched, wait, busy, ready, private, processes, most, change, replaced)


def _stats_of(loader: Any) -> dict[str, Any]:
    s = loader.stats()
    return s if isinstance(s, dict) else s.to_dict()  # a runtime _core.Loader gives LoaderStats
