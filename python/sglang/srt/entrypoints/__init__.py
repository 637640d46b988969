"""Entry points: the offline Engine and (beside it) the HTTP server."""
