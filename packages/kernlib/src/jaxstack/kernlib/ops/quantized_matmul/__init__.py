"""Matmul against int8 / int4 weights with per-channel or per-tile scales."""
