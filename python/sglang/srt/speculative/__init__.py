"""Speculative decoding: draft proposers (n-gram lookup) and the target's verify rules."""
