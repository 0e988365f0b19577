"""Profiling: capture, op profile, roofline, memory and step-time reports."""

__all__: list[str] = []
