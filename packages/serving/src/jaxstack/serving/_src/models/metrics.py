"""Prometheus metrics of the model server, in a registry of its own (one per server).

Names follow Prometheus conventions: `_total` counters, `_seconds` histograms, labels `model`
and `version`. The batch-size histogram counts real rows (before padding); padding is its own
counter, so the waste of a compiled-size set is visible.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from jaxstack.serving._src.models.batcher import BatchStats

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
)
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

        def metric(kind, name, documentation, labels=("model", "version"), **kwargs):
            return kind(
                f"jaxstack_serving_{name}", documentation, labels, registry=self.registry, **kwargs
            )

        latency = {"buckets": _LATENCY_BUCKETS}
        self.requests = metric(
            Counter,
            "requests",
            "Inference requests by model, version and HTTP status code.",
            ("model", "version", "code"),
        )
        self.latency = metric(
            Histogram,
            "request_latency_seconds",
            "Time from receiving an inference request to its response being ready.",
            **latency,
        )
        self.queue_time = metric(
            Histogram,
            "queue_time_seconds",
            "Time a request waited in the dynamic-batching queue.",
            **latency,
        )
        self.compute_time = metric(
            Histogram,
            "batch_compute_seconds",
            "Time to run one merged batch through the model, split included.",
            **latency,
        )
        self.batch_size = metric(
            Histogram,
            "batch_size",
            "Rows per executed batch, before padding.",
            buckets=_BATCH_BUCKETS,
        )
        self.padding_rows = metric(
            Counter, "padding_rows", "Rows added to reach a compiled batch size."
        )
        self.queue_depth = metric(Gauge, "queue_depth", "Requests waiting in the queue now.")
        self.versions_loaded = metric(
            Gauge, "model_versions_loaded", "Model versions ready to serve.", ("model",)
        )
        self.load_failures = metric(
            Counter,
            "load_failures",
            "Model versions that failed to load (partial, corrupted, wrong platform).",
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
