"""`jaxstack-ckpt`: look into, check and export checkpoints from the shell.

    jaxstack-ckpt ls DIR [--verify]           steps, status, size, metrics (--verify: hashes)
    jaxstack-ckpt inspect DIR [--step N]      tree paths, shapes, dtypes, sizes, versions
    jaxstack-ckpt verify DIR [--step N]       recompute content hashes
    jaxstack-ckpt export-safetensors DIR OUT [--step N] [--subtree params|--all]

Everything is read-only on DIR and safe while a job is writing to it. Exit status: 1 when a
listed or verified step is damaged; 2, with one line on stderr, when DIR is missing, is a file
or holds no checkpoint (`step_NNNNNNNN` folders), or the step asked for is missing or unreadable.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Sequence
from pathlib import Path

from jaxstack.ckptlib._src.catalog import (
    list_checkpoints,
    missing_checkpoints_message,
    read_manifest,
    verify_checkpoints,
)
from jaxstack.ckptlib._src.errors import CheckpointNotFoundError, Error


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _ls(args: argparse.Namespace) -> int:
    infos = list_checkpoints(args.directory, verify=args.verify)
    if not infos:
        raise CheckpointNotFoundError(missing_checkpoints_message(Path(args.directory)))
    if args.verify:
        print("checked: every file's sha256 against the manifest")
    else:
        print(
            "checked: manifest and file sizes only (flipped bits pass); "
            f"`jaxstack-ckpt ls --verify {args.directory}` hashes every file"
        )
    ok = "ok" if args.verify else "sizes ok"
    print(f"{'step':>10}  {'status':8}  {'size':>10}  {'created (UTC)':19}  metrics")
    for info in infos:
        created = (
            datetime.datetime.fromtimestamp(info.created_unix, datetime.UTC).strftime(
                "%Y-%m-%d %H:%M:%S"
            )
            if info.created_unix
            else "-"
        )
        metrics = ", ".join(f"{k}={v:.6g}" for k, v in info.metrics.items() if v is not None)
        status = ok if info.ok else "DAMAGED"
        print(f"{info.step:>10}  {status:8}  {_size(info.size_bytes):>10}  {created:19}  {metrics}")
        for problem in info.problems:
            print(f"{'':>12}{problem}")
    return 0 if all(info.ok for info in infos) else 1


def _inspect(args: argparse.Namespace) -> int:
    import numpy as np  # here, not at the top: `--help` and `ls` answer without loading NumPy

    manifest = read_manifest(args.directory, args.step)
    total = 0
    rows = []
    for leaf in manifest["leaves"]:
        nbytes = int(np.prod(leaf["shape"], dtype=np.int64)) * np.dtype(leaf["dtype"]).itemsize
        total += nbytes
        rows.append(("/".join(leaf["path"]), str(tuple(leaf["shape"])), leaf["dtype"], nbytes))
    width = max(len(r[0]) for r in rows)
    print(f"step {manifest['step']}  ({len(rows)} leaves, {_size(total)} of array data)")
    print(f"versions: {', '.join(f'{k} {v}' for k, v in manifest['versions'].items())}")
    if manifest.get("metrics"):
        print(f"metrics: {manifest['metrics']}")
    print(f"{'path':{width}}  {'shape':>18}  {'dtype':>9}  {'size':>10}")
    for path, shape, dtype, nbytes in rows:
        print(f"{path:{width}}  {shape:>18}  {dtype:>9}  {_size(nbytes):>10}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    results = verify_checkpoints(args.directory, args.step)
    bad = 0
    for r in results:
        print(f"{r.path.name}: {'ok' if r.ok else 'DAMAGED'}")
        for problem in r.problems:
            print(f"    {problem}")
        bad += not r.ok
    return 1 if bad else 0


def _export(args: argparse.Namespace) -> int:
    from jaxstack.ckptlib._src.interop import export_params

    subtree = None if args.all else args.subtree
    out = export_params(args.directory, args.out, step=args.step, subtree=subtree)
    print(f"wrote {out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxstack-ckpt", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ls", help="list checkpoints (checks sizes; --verify hashes)")
    p.add_argument("directory")
    p.add_argument("--verify", action="store_true", help="recompute every file's hash")
    p.set_defaults(func=_ls)
    p = sub.add_parser("inspect", help="tree, shapes, dtypes, sizes of one checkpoint")
    p.add_argument("directory")
    p.add_argument("--step", type=int, default=None)
    p.set_defaults(func=_inspect)
    p = sub.add_parser("verify", help="recompute content hashes")
    p.add_argument("directory")
    p.add_argument("--step", type=int, default=None)
    p.set_defaults(func=_verify)
    p = sub.add_parser("export-safetensors", help="write params (or all) to a safetensors file")
    p.add_argument("directory")
    p.add_argument("out")
    p.add_argument("--step", type=int, default=None)
    p.add_argument("--subtree", default="params", help="/-path to export (default: params)")
    p.add_argument("--all", action="store_true", help="export the whole state")
    p.set_defaults(func=_export)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Error as e:
        print(f"jaxstack-ckpt: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
