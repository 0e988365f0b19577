"""The names of the packing methods, apart from `pack` so that reading them needs no Grain (the
command line offers them as choices in its `--help`)."""

PACKING_METHODS = ("first_fit", "concat", "pad")
"""The `packing=` methods: "first_fit" (the default: whole documents placed in the first row
with room), "concat" (back to back, cut every `seq_len`) and "pad" (one per row, padded)."""
