"""Checkpoint save/restore throughput of jaxstack.ckptlib vs raw Orbax, raw TensorStore, numpy.save.

    .venv/bin/python benchmarks/ckptlib/bench_ckpt.py [--gb 1.0] [--repeats 3] [--dir /tmp/x]
    .venv/bin/python benchmarks/ckptlib/bench_ckpt.py --quick    # 0.1 GB, once, into quick/

Writes results.json and results.md next to this file. One state of ~`--gb` GB (params + AdamW
mu/nu, float32, random so that compression cannot shortcut anything) is saved and restored by
each method in turn, `--repeats` times, same process, same disk; medians are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import tensorstore as ts

from jaxstack.ckptlib import CheckpointManager

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conditions import conditions_markdown, measure_conditions

HERE = Path(__file__).parent


def make_state(gb: float) -> dict:
    n_arrays = 8
    cols = 2048
    rows = int(gb * 1e9 / 3 / n_arrays / cols / 4)
    key = jax.random.key(0)
    params = {}
    for i in range(n_arrays):
        key, sub = jax.random.split(key)
        params[f"layer_{i}"] = jax.random.normal(sub, (rows, cols), jnp.float32)
    opt_state = optax.adamw(1e-3).init(params)
    opt_state = jax.tree.map(lambda x: x + 0.5 if x.dtype == jnp.float32 else x, opt_state)
    state = {"params": params, "opt_state": opt_state, "step": 1}
    jax.block_until_ready(state)
    return state


def nbytes(state) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(state) if hasattr(x, "nbytes"))


def abstract(state):
    return jax.tree.map(
        lambda x: (
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
            if isinstance(x, jax.Array)
            else x
        ),
        state,
    )


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# ------------------------------------------------------------------------------------ methods


def ckptlib_save(state, root: Path, async_save: bool) -> tuple[float, float]:
    mgr = CheckpointManager(root, async_save=async_save)
    t0 = time.perf_counter()
    mgr.save(1, state, data_state={"pos": 1}, metadata={"bench": True})
    blocked = time.perf_counter() - t0
    mgr.wait()
    total = time.perf_counter() - t0
    mgr.close()
    return blocked, total


def ckptlib_restore(state, root: Path, verify: bool) -> float:
    mgr = CheckpointManager(root, read_only=True)
    seconds, restored = timed(
        lambda: jax.block_until_ready(mgr.restore(target=abstract(state), verify=verify).state)
    )
    del restored
    return seconds


def orbax_save(state, root: Path) -> tuple[float, float]:
    checkpointer = ocp.StandardCheckpointer()
    t0 = time.perf_counter()
    checkpointer.save(root / "ckpt", state)
    blocked = time.perf_counter() - t0
    checkpointer.wait_until_finished()
    total = time.perf_counter() - t0
    checkpointer.close()
    return blocked, total


def orbax_restore(state, root: Path) -> float:
    checkpointer = ocp.StandardCheckpointer()
    seconds, _ = timed(
        lambda: jax.block_until_ready(checkpointer.restore(root / "ckpt", abstract(state)))
    )
    checkpointer.close()
    return seconds


def _leaves(state):
    return [
        ("_".join(str(jax.tree_util.keystr(k, simple=True, separator="_")).split()), x)
        for k, x in jax.tree_util.tree_flatten_with_path(state)[0]
        if isinstance(x, jax.Array)
    ]


def tensorstore_save(state, root: Path) -> tuple[float, float]:
    async def run():
        async def one(name, x):
            arr = np.asarray(x)
            store = await ts.open(
                {
                    "driver": "zarr3",
                    "kvstore": {"driver": "file", "path": str(root / name)},
                    "metadata": {"shape": list(arr.shape), "data_type": arr.dtype.name},
                },
                create=True,
                delete_existing=True,
            )
            await store.write(arr)

        await asyncio.gather(*(one(n, x) for n, x in _leaves(state)))

    seconds, _ = timed(lambda: asyncio.run(run()))
    return seconds, seconds


def tensorstore_restore(state, root: Path) -> float:
    async def run():
        async def one(name):
            store = await ts.open(
                {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / name)}}
            )
            return jax.device_put(await store.read())

        return await asyncio.gather(*(one(n) for n, _ in _leaves(state)))

    seconds, _ = timed(lambda: jax.block_until_ready(asyncio.run(run())))
    return seconds


def numpy_save(state, root: Path) -> tuple[float, float]:
    def run():
        root.mkdir(parents=True, exist_ok=True)
        for name, x in _leaves(state):
            np.save(root / f"{name}.npy", np.asarray(x))

    seconds, _ = timed(run)
    return seconds, seconds


def numpy_restore(state, root: Path) -> float:
    def run():
        return [jax.device_put(np.load(root / f"{n}.npy")) for n, _ in _leaves(state)]

    seconds, _ = timed(lambda: jax.block_until_ready(run()))
    return seconds


# ------------------------------------------------------------------------------------- driver


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/jaxstack-ckptlib-bench")
    parser.add_argument("--out", default=None, help="default: this folder (quick/ with --quick)")
    parser.add_argument("--quick", action="store_true", help="a 0.1 GB state, one repeat")
    args = parser.parse_args()
    if args.quick:
        args.gb, args.repeats = 0.1, 1
    versions = ["jax", "jaxlib", "orbax-checkpoint", "tensorstore", "jaxstack-ckptlib"]
    with measure_conditions(packages=versions) as conditions:
        results = run(args)
    results["conditions"] = conditions.as_dict()
    out = Path(args.out or (HERE / "quick" if args.quick else HERE))
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(render(results))
    print(render(results))


def run(args: argparse.Namespace) -> dict:
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    state = make_state(args.gb)
    size = nbytes(state)
    print(f"state: {size / 1e9:.3f} GB in {len(jax.tree.leaves(state))} leaves", flush=True)

    save_methods = {
        "ckptlib async": lambda r: ckptlib_save(state, r, True),
        "ckptlib sync": lambda r: ckptlib_save(state, r, False),
        "orbax StandardCheckpointer (async)": lambda r: orbax_save(state, r),
        "tensorstore zarr3 (sync)": lambda r: tensorstore_save(state, r),
        "numpy.save (sync)": lambda r: numpy_save(state, r),
    }
    restore_methods = {
        "ckptlib async": [
            ("ckptlib restore (verify hashes)", lambda r: ckptlib_restore(state, r, True)),
            ("ckptlib restore (no verify)", lambda r: ckptlib_restore(state, r, False)),
        ],
        "orbax StandardCheckpointer (async)": [
            ("orbax StandardCheckpointer.restore", lambda r: orbax_restore(state, r))
        ],
        "tensorstore zarr3 (sync)": [("tensorstore read", lambda r: tensorstore_restore(state, r))],
        "numpy.save (sync)": [("numpy.load", lambda r: numpy_restore(state, r))],
    }
    saves: dict[str, dict[str, list[float]]] = {
        m: {"blocked": [], "total": []} for m in save_methods
    }
    restores: dict[str, list[float]] = {}
    for rep in range(args.repeats):
        for name, save in save_methods.items():
            root = work / f"{rep}-{name.split()[0]}-{len(saves[name]['total'])}"
            blocked, total = save(root)
            saves[name]["blocked"].append(blocked)
            saves[name]["total"].append(total)
            print(f"[{rep}] save {name}: blocked {blocked:.3f} s, total {total:.3f} s", flush=True)
            for rname, restore in restore_methods.get(name, []):
                seconds = restore(root)
                restores.setdefault(rname, []).append(seconds)
                print(f"[{rep}] {rname}: {seconds:.3f} s", flush=True)
            shutil.rmtree(root, ignore_errors=True)

    sync_total = statistics.median(saves["ckptlib sync"]["total"])
    results = {
        "state_bytes": size,
        "repeats": args.repeats,
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "jax": jax.__version__,
            "orbax-checkpoint": importlib.metadata.version("orbax-checkpoint"),
            "tensorstore": importlib.metadata.version("tensorstore"),
        },
        "save": {
            name: {
                "blocked_s_median": statistics.median(v["blocked"]),
                "total_s_median": statistics.median(v["total"]),
                "GB_per_s": size / 1e9 / statistics.median(v["total"]),
                "runs_total_s": v["total"],
            }
            for name, v in saves.items()
        },
        "restore": {
            name: {
                "s_median": statistics.median(v),
                "GB_per_s": size / 1e9 / statistics.median(v),
                "runs_s": v,
            }
            for name, v in restores.items()
        },
        "async_blocked_fraction_of_sync": statistics.median(saves["ckptlib async"]["blocked"])
        / sync_total,
    }
    shutil.rmtree(work, ignore_errors=True)
    return results


def render(r: dict) -> str:
    size_gb = r["state_bytes"] / 1e9
    ref_save = r["save"]["ckptlib sync"]["total_s_median"]
    lines = [
        f"# ckptlib checkpoint benchmark ({size_gb:.2f} GB state, medians of {r['repeats']})",
        "",
        f"Host: {r['host']['cpus']} CPUs ({r['host']['machine']}), jax {r['host']['jax']}, "
        f"orbax-checkpoint {r['host']['orbax-checkpoint']}, "
        f"tensorstore {r['host']['tensorstore']}. "
        "All methods ran interleaved in one process on the same disk. Restores read from the page "
        "cache (files were just written).",
        "",
        conditions_markdown(r["conditions"])
        if "conditions" in r
        else "Run conditions were not measured (this run predates benchmarks/conditions.py).",
        "",
        "## Save",
        "",
        "| method | blocked (s) | total (s) | GB/s (total) | total vs ckptlib sync |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, v in r["save"].items():
        lines.append(
            f"| {name} | {v['blocked_s_median']:.3f} | {v['total_s_median']:.3f} | "
            f"{v['GB_per_s']:.2f} | {v['total_s_median'] / ref_save:.2f}x |"
        )
    ref_restore = r["restore"]["ckptlib restore (no verify)"]["s_median"]
    lines += [
        "",
        f"Async blocked time / sync save time: **{r['async_blocked_fraction_of_sync']:.1%}** "
        "(goal <= 10%).",
        "",
        "## Restore",
        "",
        "| method | seconds | GB/s | vs ckptlib (no verify) |",
        "|---|---:|---:|---:|",
    ]
    for name, v in r["restore"].items():
        lines.append(
            f"| {name} | {v['s_median']:.3f} | {v['GB_per_s']:.2f} | "
            f"{v['s_median'] / ref_restore:.2f}x |"
        )
    lines += [
        "",
        "ckptlib's save total includes what the others do not do: fsync of every file, SHA-256 of "
        "every file for the manifest, and the commit rename. numpy.save and the raw TensorStore "
        "writes neither fsync nor hash; Orbax's save includes its own finalisation.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
