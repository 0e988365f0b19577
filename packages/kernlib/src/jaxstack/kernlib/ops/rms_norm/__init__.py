"""Fused RMS normalisation with a fused backward."""
