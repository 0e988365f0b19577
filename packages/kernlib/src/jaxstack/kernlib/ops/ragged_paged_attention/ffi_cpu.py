"""Ragged paged attention on CPU as an XLA FFI custom call (`ffi_cpu.cc`, built at first use by
`kernlib._src.native`).

XLA:CPU materialises each gather of pages (`xla.py` copies every key and value it reads before
its matmuls read them again); the custom call reads the pages where they lie and spreads
(query tile, kv head) items over XLA's intra-op threads. Either cache layout; float32 and
bfloat16 (computed in float32). Forward only, like the Pallas kernels: no gradient rule.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxstack.kernlib._src import native
from jaxstack.kernlib.ops.ragged_paged_attention import base

SOURCE = Path(__file__).with_name("ffi_cpu.cc")
SYMBOLS = {"float32": "RaggedPagedAttentionF32", "bfloat16": "RaggedPagedAttentionBF16"}


def target(dtype) -> str:
    return f"jaxstack_kernlib_ragged_paged_attention_{jnp.dtype(dtype).name}"


@functools.cache
def registered() -> str | None:
    """None once the kernels are registered with XLA:CPU, else why they cannot be."""
    lib = native.library(SOURCE)
    if isinstance(lib, str):
        return lib
    for dtype, symbol in SYMBOLS.items():
        capsule = jax.ffi.pycapsule(getattr(lib, symbol))
        jax.ffi.register_ffi_target(target(dtype), capsule, platform="cpu")
    return None


def check(q, k_pages, *arrays, **options) -> str | None:
    """Why the custom call cannot run this call (dtype, or no kernel built), or None."""
    if jnp.dtype(q.dtype).name not in SYMBOLS:
        return f"q dtype {q.dtype} is neither float32 nor bfloat16"
    return base.dtype_mismatch(q, k_pages) or registered()


def run(q, k_pages, v_pages, kv_lens, block_tables, query_start_loc, num_seqs=None, **options):
    """The arguments are `base`'s (its module docstring documents them); `config` and
    `interpret` are not used."""
    st = base.static(q, k_pages, block_tables, **options)
    live = base.live_seqs(num_seqs, kv_lens.shape[0]).reshape(1)
    call = jax.ffi.ffi_call(
        target(q.dtype), jax.ShapeDtypeStruct(q.shape, q.dtype), vmap_method="sequential"
    )
    return call(
        q,
        k_pages,
        v_pages,
        kv_lens.astype(jnp.int32),
        block_tables.astype(jnp.int32),
        query_start_loc.astype(jnp.int32),
        live,
        scale=np.float32(st.scale),
        cap=np.float32(st.cap or 0.0),
        window=np.int64(st.window or 0),
        head_major=options.get("kv_layout", base.PAGE_MAJOR) == base.HEAD_MAJOR,
    )
