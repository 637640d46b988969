"""The `observability` namespace: logging, metrics, the watchdog."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.arg_groups.arg_utils import arg

LOG_LEVEL_CHOICES = ("debug", "info", "warning", "error", "critical")


@dataclass(kw_only=True)
class ObservabilityArgs:
    _NS_PATH = "observability"

    log_level: str = arg("info", "Log level of every process.", choices=LOG_LEVEL_CHOICES)
    log_requests: bool = arg(False, "Log each request's inputs and outputs.")
    enable_metrics: bool = arg(False, "Serve Prometheus metrics at /metrics.")
    watchdog_timeout: float = arg(
        300.0, "Seconds a scheduler step may take before the watchdog kills the server."
    )
    show_time_cost: bool = arg(
        False, "Log the time spent in each stage.", unsupported="per-stage timing logs"
    )
