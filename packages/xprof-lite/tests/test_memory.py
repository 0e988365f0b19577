"""Compiled memory, live arrays by origin, and trace readers on a GPU-shaped synthetic XSpace."""

import jax
import jax.numpy as jnp
import pytest
from jax.profiler import ProfileData

from jaxstack import xprof_lite

MS = 10**9  # picoseconds per millisecond


def xspace(planes: dict[str, dict[str, list[tuple]]]) -> ProfileData:
    """An XSpace from {plane: {line: [(name, start_ms, dur_ms, {stat: value})]}}."""
    out = []
    for plane_id, (plane, lines) in enumerate(planes.items(), 1):
        names, stats, line_text = {}, {}, []
        for line_id, (line, evs) in enumerate(lines.items(), 1):
            ev_text = []
            for name, start, dur, st in evs:
                mid = names.setdefault(name, len(names) + 1)
                stat_text = []
                for key, value in st.items():
                    sid = stats.setdefault(key, len(stats) + 1)
                    field = (
                        f'str_value: "{value}"'
                        if isinstance(value, str)
                        else f"int64_value: {value}"
                    )
                    stat_text.append(f"stats {{ metadata_id: {sid} {field} }}")
                ev_text.append(
                    f"events {{ metadata_id: {mid} offset_ps: {int(start * MS)} "
                    f"duration_ps: {int(dur * MS)} {' '.join(stat_text)} }}"
                )
            line_text.append(f'lines {{ id: {line_id} name: "{line}" {" ".join(ev_text)} }}')
        meta = (
            " ".join(
                f'event_metadata {{ key: {i} value {{ id: {i} name: "{n}" }} }}'
                for n, i in names.items()
            )
            + " "
            + " ".join(
                f'stat_metadata {{ key: {i} value {{ id: {i} name: "{n}" }} }}'
                for n, i in stats.items()
            )
        )
        out.append(f'planes {{ id: {plane_id} name: "{plane}" {" ".join(line_text)} {meta} }}')
    return ProfileData.from_text_proto(" ".join(out))


def op(name, module="jit_step"):
    return {"hlo_op": name, "hlo_module": module}


GPU_TRACE = {
    "/host:CPU": {
        "python": [
            ("train", 0, 10, {"step_num": 0}),
            ("data_wait", 0.5, 1.5, {}),
            ("train", 10, 10, {"step_num": 1}),
            ("checkpoint", 16, 3, {}),
        ],
        "allocator": [
            ("MemoryAllocation", 2, 0.01, {"peak_bytes_in_use": 1000}),
            ("MemoryAllocation", 5, 0.01, {"peak_bytes_in_use": 3000}),
            ("MemoryDeallocation", 12, 0.01, {"peak_bytes_in_use": 2000}),
            ("MemoryAllocation", 15, 0.01, {"peak_bytes_in_use": 2500}),
        ],
        "launch": [("dot.1", 1, 0.1, op("dot.1"))],  # host-side launch record: ignored
    },
    "/device:GPU:0": {
        "XLA Ops": [
            ("while.1", 1, 8, op("while.1")),
            ("dot.1", 2, 2, op("dot.1")),
            ("fusion.2", 5, 1, op("fusion.2")),
            ("dot.1", 11, 2, op("dot.1")),
        ],
    },
}


def test_device_plane_op_self_times():
    times = xprof_lite.hlo_op_times(xspace(GPU_TRACE))
    assert times[("jit_step", "dot.1")].total_ns == pytest.approx(4e6)
    assert times[("jit_step", "dot.1")].occurrences == 2
    assert times[("jit_step", "fusion.2")].total_ns == pytest.approx(1e6)
    assert times[("jit_step", "while.1")].total_ns == pytest.approx(5e6)  # 8 ms minus its body


def test_peak_memory_and_breakdown_per_step():
    data = xspace(GPU_TRACE)
    assert xprof_lite.peak_memory_per_step(data) == {0: 3000, 1: 2500}
    step0, step1 = xprof_lite.step_breakdown(data)
    assert (step0.total_ms, step0.data_wait_ms, step0.checkpoint_ms) == pytest.approx((10, 1.5, 0))
    assert step0.compute_ms == pytest.approx(8.5)
    assert step0.device_busy_ms == pytest.approx(8)
    assert (step1.checkpoint_ms, step1.compute_ms, step1.device_busy_ms) == pytest.approx((3, 7, 2))


def test_compiled_memory_counts_arguments_and_outputs():
    x = jax.ShapeDtypeStruct((256, 128), jnp.float32)
    w = jax.ShapeDtypeStruct((128, 64), jnp.float32)
    mem = xprof_lite.compiled_memory(lambda x, w: x @ w, x, w)
    assert mem["argument_bytes"] == 4 * (256 * 128 + 128 * 64)
    assert mem["output_bytes"] == 4 * 256 * 64
    assert set(mem) >= {"temp_bytes", "code_bytes", "alias_bytes"}


def test_live_arrays_by_size_and_origin():
    params = {"layer": {"kernel": jnp.zeros((300, 200)), "bias": jnp.zeros((200,))}}
    activations = jax.jit(lambda p: p["layer"]["kernel"] * 2)(params)
    arrays = xprof_lite.live_arrays({"params": params})
    origins = {a.origin: a for a in arrays}
    assert origins["params/layer/kernel"].nbytes == 300 * 200 * 4
    assert origins["params/layer/bias"].shape == (200,)
    # jit outputs remember the line that made them.
    made_here = [a for a in arrays if "test_memory.py" in a.origin]
    assert any(a.nbytes == activations.nbytes for a in made_here)
    sizes = [a.nbytes for a in arrays]
    assert sizes == sorted(sizes, reverse=True)
    by_origin = xprof_lite.live_bytes_by_origin(arrays)
    assert by_origin["params"] >= 300 * 200 * 4 + 200 * 4


def test_cpu_trace_has_no_allocator_events(tmp_path):
    with xprof_lite.trace(tmp_path, perfetto=False) as cap, xprof_lite.step_annotation(0):
        jax.block_until_ready(jnp.ones(8) * 2)
    assert xprof_lite.peak_memory_per_step(cap.xplane_path) == {}


def test_raw_gpu_kernel_annotations_and_derived_lines():
    annotation = "{fusion.3:#hlo_op=fusion.3,hlo_module=jit_f,program_id=7#}"
    data = xspace(
        {
            "/device:GPU:0": {
                "Stream #13(compute)": [
                    ("loop_fusion_kernel", 1, 2, {"kernel_annotation": annotation}),
                    ("loop_fusion_kernel", 4, 1, {"kernel_annotation": annotation}),
                ],
                "XLA Modules": [("jit_f", 0, 6, op("jit_f", "jit_f"))],  # derived: ignored
            }
        }
    )
    times = xprof_lite.hlo_op_times(data)
    assert set(times) == {("jit_f", "fusion.3")}
    assert times[("jit_f", "fusion.3")].total_ns == pytest.approx(3e6)
    assert times[("jit_f", "fusion.3")].occurrences == 2
