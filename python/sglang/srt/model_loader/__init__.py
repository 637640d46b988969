"""Checkpoint loading: local dirs or hub ids, safetensors (sharded), dummy weights.

Entry point: `sglang.srt.model_loader.loader.get_model`.
"""
