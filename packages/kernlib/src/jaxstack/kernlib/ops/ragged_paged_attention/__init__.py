"""Attention of a ragged batch of queries against a paged KV cache (serving)."""
