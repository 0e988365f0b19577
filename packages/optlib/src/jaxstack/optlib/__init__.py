"""Declarative optimiser recipes, masks, schedules, accumulation and losses that produce plain
Optax transformations.
"""

__all__: list[str] = []
