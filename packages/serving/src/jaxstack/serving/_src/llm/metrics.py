"""Prometheus metrics of the LLM server, in a registry of its own (vLLM's set, our prefix).

Gauges of the engine's state are read when /metrics is scraped; latencies are observed by the
engine thread as tokens come out: time to first token (arrival to first sampled token),
inter-token latency (between consecutive tokens of a sequence) and end-to-end latency.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
PREFIX = "jaxstack_llm_"


class LLMMetrics:
    def __init__(self, stats, queue_length):
        """`stats()` returns the engine's counters (LLMEngine.stats); `queue_length()` the
        requests accepted but not yet running."""
        self.registry = r = CollectorRegistry()
        self._stats = stats

        def gauge(name: str, doc: str, fn) -> None:
            Gauge(PREFIX + name, doc, registry=r).set_function(fn)

        def stat(key: str):
            return lambda: self._stats()[key]

        gauge("queue_length", "Requests accepted and not yet running.", queue_length)
        gauge(
            "num_requests_running", "Sequences in the running batch.", stat("num_requests_running")
        )
        gauge(
            "num_requests_waiting",
            "Sequences waiting (new or preempted).",
            stat("num_requests_waiting"),
        )
        gauge("kv_blocks_used", "KV-cache blocks owned by sequences.", stat("kv_blocks_used"))
        gauge(
            "kv_blocks_free",
            "KV-cache blocks free (cached prefixes included).",
            stat("kv_blocks_free"),
        )
        gauge(
            "prefix_cache_hit_rate",
            "Prompt tokens found in the prefix cache / looked up.",
            self._hit_rate,
        )
        # Engine totals, kept as Prometheus counters by `count` (same names, `_total` added).
        self.counters = {
            key: Counter(PREFIX + key, doc, registry=r)
            for key, doc in (
                ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
                ("prefix_cache_hits", "Prompt tokens found in the prefix cache."),
                ("num_preemptions", "Sequences preempted for lack of KV blocks."),
                ("prompt_tokens", "Prompt tokens received."),
                ("generation_tokens", "Tokens generated."),
            )
        }
        self._counted = dict.fromkeys(self.counters, 0)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + name, doc, buckets=buckets, registry=r)

        self.ttft = histogram(
            "time_to_first_token_seconds", "Arrival to first generated token.", _TTFT_BUCKETS
        )
        self.itl = histogram(
            "inter_token_latency_seconds",
            "Time between consecutive generated tokens of a sequence.",
            _ITL_BUCKETS,
        )
        self.e2e = histogram(
            "e2e_request_latency_seconds", "Arrival to the last token of a sequence.", _E2E_BUCKETS
        )
        self.finished = Counter(
            PREFIX + "request_success",
            "Finished sequences by reason.",
            ["finish_reason"],
            registry=r,
        )
        for reason in ("stop", "length", "abort"):  # exported at 0 before the first
            self.finished.labels(reason)

    def count(self, stats: dict[str, float]) -> None:
        """Advance the counters to the engine's totals (called by the engine thread)."""
        for key, counter in self.counters.items():
            counter.inc(stats[key] - self._counted[key])
            self._counted[key] = stats[key]

    def _hit_rate(self) -> float:
        s = self._stats()
        return (
            s["prefix_cache_hits"] / s["prefix_cache_queries"] if s["prefix_cache_queries"] else 0.0
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
