"""Prometheus metrics of the model server, in a registry of its own (one per server).

Names follow Prometheus conventions: `_total` counters, `_seconds` histograms, labels `model`
and `version`. The batch-size histogram counts real rows (before padding); padding is its own
counter, so the waste of a compiled-size set is visible.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from jaxstack.serving._src.models.batcher import BatchStats

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ServingMetrics:
    """The model server's Prometheus metrics, in a registry of its own: requests by status code,
    latency, queue and batch-compute time, rows per batch, padding rows, queue depth, loaded
    versions and load failures, labelled by model and version. `/metrics` serves
    `exposition()`.

    Args:
      registry: the prometheus_client registry to register into (default: a new one).
    """

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "jaxstack_serving_requests",
            "Inference requests by model, version and HTTP status code.",
            ["model", "version", "code"],
            registry=r,
        )
        self.latency = Histogram(
            "jaxstack_serving_request_latency_seconds",
            "Time from receiving an inference request to its response being ready.",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "jaxstack_serving_queue_time_seconds",
            "Time a request waited in the dynamic-batching queue.",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.compute_time = Histogram(
            "jaxstack_serving_batch_compute_seconds",
            "Time to run one merged batch through the model, split included.",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "jaxstack_serving_batch_size",
            "Rows per executed batch, before padding.",
            ["model", "version"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.padding_rows = Counter(
            "jaxstack_serving_padding_rows",
            "Rows added to reach a compiled batch size.",
            ["model", "version"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "jaxstack_serving_queue_depth",
            "Requests waiting in the queue now.",
            ["model", "version"],
            registry=r,
        )
        self.versions_loaded = Gauge(
            "jaxstack_serving_model_versions_loaded",
            "Model versions ready to serve.",
            ["model"],
            registry=r,
        )
        self.load_failures = Counter(
            "jaxstack_serving_load_failures",
            "Model versions that failed to load (partial, corrupted, wrong platform).",
            ["model", "version"],
            registry=r,
        )

    def record_batch(self, model: str, version: int, stats: BatchStats) -> None:
        labels = (model, str(version))
        self.batch_size.labels(*labels).observe(stats.rows)
        self.padding_rows.labels(*labels).inc(stats.padded_rows - stats.rows)
        self.compute_time.labels(*labels).observe(stats.compute_seconds)
        queue_time = self.queue_time.labels(*labels)
        for seconds in stats.queue_seconds:
            queue_time.observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
