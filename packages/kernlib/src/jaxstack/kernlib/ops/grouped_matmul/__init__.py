"""Grouped (ragged) matmul for mixture-of-experts layers."""
