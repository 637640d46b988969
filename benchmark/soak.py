"""Soak a server: the mixed, hostile workload of `sglang.test.soak`, then its pass criteria.

    python benchmark/soak.py --base-url http://127.0.0.1:30000 --duration-s 60 --concurrency 64
    python benchmark/soak.py --model-path DIR   # starts its own server (small queue and pool)

Same as `python -m sglang.test.soak`; `--help` lists every option. Prints a table
(requests by kind, answers by status, errors, RSS per server process at the end
of the warm-up and of the run) and exits 1 when a criterion fails.
"""

from __future__ import annotations

import sys

from sglang.test.soak import main

if __name__ == "__main__":
    sys.exit(main())
