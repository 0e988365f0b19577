"""Flash attention (forward and backward) with GQA, packed segments, sliding window, soft-cap."""
