"""The scheduler, split by concern: admission, memory, results/outputs, requests."""
