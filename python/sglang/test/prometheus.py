"""Reading our /metrics text in tests."""

from __future__ import annotations

import re


def metric_value(text: str, name: str) -> float:
    """The value of series `sglang:<name>` (whatever its labels) in Prometheus text."""
    found = re.search(rf"^sglang:{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    if found is None:
        raise AssertionError(f"sglang:{name} not in the metrics")
    return float(found.group(1))
