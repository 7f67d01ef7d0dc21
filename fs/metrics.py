"""Prometheus metrics of a leasefs process (``prometheus_client``): the registry each
server's ``/metrics`` page exposes in Prometheus's text format, and the cheap counters
and histograms the hot paths fill.

Why it exists: operators scrape metrics (HDFS: JMX and its Prometheus sink; MooseFS, JuiceFS:
Prometheus endpoints). Each server object owns one ``CollectorRegistry`` (not the library's
global one), so several servers in one process (tests) keep their numbers apart.

Why not ``prometheus_client.Counter``/``Histogram`` on the hot paths: their ``labels()``
lookup and every increment take a lock (they are built for threads), several microseconds
per RPC of a server whose whole getFileInfo costs ~25 µs of CPU. ``Counters`` and
``Histograms`` here are plain dicts of lists filled from one trio thread; they become
metric families only when scraped (``register``). Gauges are not kept at all: a server
computes them from its own state at scrape time (``register`` with a callable), so they
cost nothing per operation.

Concurrency contract: the registry, ``Counters`` and ``Histograms`` are filled from the
owning server's trio thread; ``exposition`` renders them there too (it only reads numbers).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# seconds: 50 µs (a cached read) up to 10 s (a stalled fsync or pipeline)
LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                   0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# records per journal sync: group commit batches from 1 to thousands
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


def new_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """``(body, content type)`` of ``/metrics``."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


class Counters:
    """Counters by label values (a tuple, in ``labelnames`` order). ``name`` is without
    ``_total`` (the exposition adds it)."""

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = ()):
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self.values: dict[tuple, float] = {}

    def inc(self, labels: tuple = (), amount: float = 1) -> None:
        values = self.values
        values[labels] = values.get(labels, 0) + amount

    def get(self, labels: tuple = ()) -> float:
        return self.values.get(labels, 0)

    def collect(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in sorted(self.values.items()):
            family.add_metric(labels, value)
        return family


class Histograms:
    """Histograms by label values: per series a list of per-bucket counts (the last one is
    +Inf) and the sum in a second list; cumulated only when scraped."""

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = (),
                 buckets: tuple = LATENCY_BUCKETS):
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        self.series: dict[tuple, tuple[list[int], list[float]]] = {}

    def observe(self, labels: tuple, value: float) -> None:
        entry = self.series.get(labels)
        if entry is None:
            entry = self.series[labels] = ([0] * (len(self.bounds) + 1), [0.0])
        entry[0][bisect_left(self.bounds, value)] += 1   # le: the first bound >= value
        entry[1][0] += value

    def count(self, labels: tuple = ()) -> int:
        entry = self.series.get(labels)
        return sum(entry[0]) if entry else 0

    def collect(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        les = [_le(b) for b in self.bounds] + ["+Inf"]
        for labels, (counts, total) in sorted(self.series.items()):
            running, buckets = 0, []
            for le, n in zip(les, counts):
                running += n
                buckets.append((le, running))
            family.add_metric(labels, buckets, total[0])
        return family


def _le(bound: float) -> str:
    return repr(bound) if bound != int(bound) else f"{bound:.1f}"


class _Collector:
    def __init__(self, collect: Callable[[], Iterable[Metric]]):
        self._collect = collect

    def collect(self):
        return list(self._collect())

    def describe(self):
        # no names up front: the registry would otherwise call collect() at registration,
        # before the server's state exists
        return []


def register(registry: CollectorRegistry, collect: Callable[[], Iterable[Metric]]) -> None:
    """Have ``registry`` call ``collect()`` (metric families: ``Counters.collect()``,
    ``GaugeMetricFamily`` of current state...) at every scrape."""
    registry.register(_Collector(collect))


__all__ = ["new_registry", "exposition", "Counters", "Histograms", "register",
           "LATENCY_BUCKETS", "BATCH_BUCKETS"]
