"""Prometheus metrics of a leasefs process (``prometheus_client``): the registry each
server's ``/metrics`` page exposes in Prometheus's text format.

Why it exists: operators scrape metrics (HDFS: JMX and its Prometheus sink; MooseFS, JuiceFS:
Prometheus endpoints). Each server object owns one ``CollectorRegistry`` (not the library's
global one), so several servers in one process (tests) keep their numbers apart.

Concurrency contract: the registry is filled from the owning server's trio thread;
``exposition`` renders it there too (it only reads numbers).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


def new_registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """``(body, content type)`` of ``/metrics``."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


__all__ = ["new_registry", "exposition"]
