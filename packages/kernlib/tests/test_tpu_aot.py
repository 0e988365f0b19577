"""Every Mosaic TPU kernel compiled ahead of time for v5e, v5p and v6e by the real TPU compiler.

Needs libtpu next to jax (`nox -s tpu_aot` installs it and sets JAXSTACK_REQUIRE_LIBTPU=1, so
there a missing libtpu fails instead of skipping). On the plain CPU venv only the first test runs.
"""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstack import kernlib

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(
    not HAS_LIBTPU and not os.environ.get("JAXSTACK_REQUIRE_LIBTPU"),
    reason="libtpu is not installed (nox -s tpu_aot installs it)",
)
CASES = kernlib.aot_cases()


@pytest.mark.skipif(HAS_LIBTPU, reason="checks the error without libtpu")
def test_without_libtpu_the_error_says_how_to_get_it():
    with pytest.raises(kernlib.UnsupportedError, match="pip install libtpu"):
        kernlib.tpu_devices("v5e")


@pytest.fixture(scope="module", params=list(kernlib.TPU_TARGETS))
def chip(request):
    return kernlib.tpu_devices(request.param)[0]


@needs_libtpu
@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
def test_kernel_compiles_for_the_chip(chip, case):
    result = kernlib.aot_compile(case.fn, case.args, chip)
    assert result.compiled, result.reason
    assert result.mosaic_kernels >= 1  # the kernel itself, not an XLA fallback
    assert result.argument_bytes > 0 and result.output_bytes > 0


@needs_libtpu
def test_dispatch_chooses_mosaic_for_the_target_and_xla_outside():
    q = jax.ShapeDtypeStruct((1, 256, 4, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 256, 2, 128), jnp.bfloat16)
    chip = kernlib.tpu_devices("v6e")[0]
    with kernlib.target_device(chip):
        assert kernlib.which_implementation("attention", q, kv, kv)[0] == "pallas_mosaic_tpu"
    assert kernlib.which_implementation("attention", q, kv, kv)[0] == "xla"


@needs_libtpu
def test_kernel_on_a_four_chip_slice_compiles_inside_shard_map():
    devices = kernlib.tpu_devices("v5e")
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    spec = jax.sharding.PartitionSpec("data")

    def attention(q, k, v):
        return kernlib.attention(q, k, v, implementation="pallas_mosaic_tpu")

    # the kernels' out_shapes carry no varying-manual-axes type yet, hence check_vma=False
    sharded = jax.shard_map(
        attention, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec, check_vma=False
    )
    named = jax.sharding.NamedSharding(mesh, spec)
    args = [
        jax.ShapeDtypeStruct((8, 1024, h, 128), jnp.bfloat16, sharding=named) for h in (8, 2, 2)
    ]
    with kernlib.target_device(devices[0], mesh=mesh):
        lowered = jax.jit(sharded).lower(*args)
    compiled = lowered.compile()
    assert "@tpu_custom_call" in lowered.as_text()
    # each chip holds a quarter of the batch: q [2, 1024, 8, 128] and k, v [2, 1024, 2, 128]
    per_chip = 2 * 1024 * (8 + 2 + 2) * 128 * 2
    assert compiled.memory_analysis().argument_size_in_bytes == per_chip
