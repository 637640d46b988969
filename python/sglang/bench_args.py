"""Argument types the bench CLIs share: a bad value is one argparse error naming it."""

from __future__ import annotations

import argparse


def at_least_one(text: str) -> int:
    """An integer >= 1 (a count, a length, a concurrency)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: an integer >= 1")
    return value
