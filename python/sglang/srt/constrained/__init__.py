"""Grammar-constrained decoding: backends (xgrammar), the compile manager, token masks."""
