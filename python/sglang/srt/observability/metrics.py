"""Prometheus metrics of the HTTP server (prefix `sglang:`).

Request-level figures (tokens, latencies) are recorded in the main process as
outputs stream out of the TokenizerManager; scheduler-level gauges (running and
queued requests, KV usage, cache hit rate, throughput) are refreshed from the
schedulers' internal state each time `/metrics` is scraped.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "sglang:"
LABELS = ("model_name",)
_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 60.0, 120.0,
)  # fmt: skip
# gauge -> (the scheduler's internal_state keys, first present wins; how schedulers combine)
_GAUGE_SOURCES = {
    "num_running_reqs": (("num_running_reqs",), "sum"),
    "num_queue_reqs": (("num_queued_reqs", "num_queue_reqs"), "sum"),
    "token_usage": (("token_usage",), "mean"),
    "cache_hit_rate": (("cache_hit_rate",), "mean"),
    "gen_throughput": (("last_gen_throughput", "gen_throughput"), "sum"),
    "spec_accept_length": (("avg_spec_accept_length",), "mean"),
    "num_grammar_queue_reqs": (("num_grammar_queue_reqs",), "sum"),
}
_GAUGE_HELP = {
    "num_running_reqs": "Requests in the running (decode) batch.",
    "num_queue_reqs": "Requests waiting in the scheduler queue.",
    "token_usage": "Fraction of KV-cache slots in use.",
    "cache_hit_rate": "Prefix-cache hit rate over the prefills since start or the last flush.",
    "gen_throughput": "Generation throughput (tokens/s) over the last 2 s window of decoding; 0 when idle.",
    "spec_accept_length": "Speculative decoding: tokens kept per verify round (drafts + 1).",
    "num_grammar_queue_reqs": "Constrained requests waiting for their grammar to compile.",
}


class ServerMetrics:
    """The server's metric families, in a registry of their own; every series carries
    SGLang's `model_name` label (the served model name), so its dashboards work."""

    def __init__(self, model_name: str = "default") -> None:
        self.registry = CollectorRegistry()
        label = {"model_name": model_name}
        self._counters = {
            name: Counter(PREFIX + name, doc, LABELS, registry=self.registry).labels(**label)
            for name, doc in (
                ("prompt_tokens", "Prompt tokens processed."),
                ("generation_tokens", "Tokens generated."),
                ("cached_tokens", "Prompt tokens served from the prefix cache."),
                ("num_requests", "Requests finished (any reason)."),
                ("num_aborted_requests", "Requests finished by an abort."),
            )
        }
        self._histograms = {
            name: Histogram(
                PREFIX + name, doc, LABELS, buckets=_LATENCY_BUCKETS, registry=self.registry
            ).labels(**label)
            for name, doc in (
                ("time_to_first_token_seconds", "Time to the first output token."),
                ("inter_token_latency_seconds", "Time between output tokens."),
                ("e2e_request_latency_seconds", "Time from arrival to the last token."),
                ("queue_time_seconds", "Time spent waiting in the scheduler queue."),
            )
        }
        self._gauges = {
            name: Gauge(PREFIX + name, _GAUGE_HELP[name], LABELS, registry=self.registry).labels(
                **label
            )
            for name in _GAUGE_SOURCES
        }

    def track(self) -> RequestTracker:
        return RequestTracker(self)

    def observe(self, histogram: str, seconds: float) -> None:
        self._histograms[histogram].observe(seconds)

    def count(self, counter: str, amount: float = 1.0) -> None:
        if amount > 0:
            self._counters[counter].inc(amount)

    def set_scheduler_states(self, states: list[dict[str, Any]]) -> None:
        """Refresh the gauges from each scheduler's `get_internal_state()` dict."""
        for gauge, (keys, combine) in _GAUGE_SOURCES.items():
            values = [v for v in map(_first_number(keys), states) if v is not None]
            if not values:
                continue
            total = sum(values)
            self._gauges[gauge].set(total if combine == "sum" else total / len(values))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _first_number(keys: tuple[str, ...]):
    def pick(state: dict[str, Any]) -> float | None:
        for key in keys:
            if isinstance(state.get(key), (int, float)):
                return float(state[key])
        return None

    return pick


class RequestTracker:
    """Timing of one generate call, fed with each cumulative output. Its latency
    samples are recorded when it finishes: a request cancelled before (a batch
    sibling of a refused prompt) leaves no trace in the histograms."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics
        self._start_s = time.perf_counter()
        self._last_s: float | None = None
        self._last_tokens = 0
        self._last_meta: dict[str, Any] = {}  # the latest output's meta_info
        self._ttft_s: float | None = None
        self._itl_steps: list[tuple[float, int]] = []  # (seconds per token, tokens)

    def on_output(self, output: dict[str, Any]) -> None:
        now = time.perf_counter()
        meta = self._last_meta = output["meta_info"]
        num_tokens = int(meta.get("completion_tokens", 0))
        if num_tokens > self._last_tokens:
            self._on_new_tokens(now, num_tokens - self._last_tokens)
            self._last_tokens = num_tokens
        if meta.get("finish_reason") is not None:
            self._on_finish(now, meta)

    def _on_new_tokens(self, now: float, num_new: int) -> None:
        if self._last_s is None:
            self._ttft_s = now - self._start_s
        else:
            self._itl_steps.append(((now - self._last_s) / num_new, num_new))
        self._last_s = now

    def _on_finish(self, now: float, meta: dict[str, Any], aborted: bool = False) -> None:
        m = self._metrics
        if self._ttft_s is not None:
            m.observe("time_to_first_token_seconds", self._ttft_s)
        for per_token_s, num_tokens in self._itl_steps:
            for _ in range(num_tokens):
                m.observe("inter_token_latency_seconds", per_token_s)
        m.observe("e2e_request_latency_seconds", now - self._start_s)
        if isinstance(meta.get("queue_time"), (int, float)):
            m.observe("queue_time_seconds", float(meta["queue_time"]))
        self._count_tokens(meta)
        m.count("num_requests")
        if aborted or (meta.get("finish_reason") or {}).get("type") == "abort":
            m.count("num_aborted_requests")

    def _count_tokens(self, meta: dict[str, Any]) -> None:
        self._metrics.count("prompt_tokens", meta.get("prompt_tokens", 0))
        self._metrics.count("generation_tokens", meta.get("completion_tokens", 0))
        self._metrics.count("cached_tokens", meta.get("cached_tokens", 0))

    def on_abort(self) -> None:
        """The consumer stopped before the request finished (disconnect, shutdown): it
        ends here, aborted, and the tokens it had were computed all the same."""
        self._on_finish(time.perf_counter(), self._last_meta, aborted=True)

    def on_failure(self) -> None:
        """The request failed in the runtime (a 5xx): it finished, with what it had."""
        self._on_finish(time.perf_counter(), self._last_meta)
