"""Triton kernels of the triton attention backend (imported only by that backend)."""
