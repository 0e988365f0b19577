"""Private machinery shared by every op: errors, device facts, choice, tuning cache."""
