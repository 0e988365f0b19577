"""One sub-package per op: `api.py` (the public function), `base.py` (XLA reference and shared
types), and one module per backend beside them (`xla.py`, `pallas_triton.py`,
`pallas_mosaic_tpu.py`)."""
