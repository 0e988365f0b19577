"""`jaxstack-kern`: autotune kernels on this device, show the tuning cache, explain choices.

jaxstack-kern autotune --op attention --dims batch=1,seq=8192,heads=16,kv_heads=8
jaxstack-kern autotune --op all            # each op's default problem
jaxstack-kern show
jaxstack-kern which --op attention --dims seq=2048
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# JAX loads inside the commands that run kernels, so --help and `show` answer at once.
from jaxstack.kernlib._src import registry, tuning
from jaxstack.kernlib._src.errors import ConfigError


def parse_dims(text: str) -> dict[str, int]:
    dims = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise ConfigError(f"--dims item {item!r} must look like name=integer")
        dims[key.strip()] = int(value)
    return dims


def _cache(args) -> tuning.TuningCache:
    return tuning.TuningCache(user_path=Path(args.cache)) if args.cache else tuning.default_cache()


def _autotune(args) -> int:
    from jaxstack.kernlib._src import autotune

    ops = registry.OP_NAMES if args.op == "all" else (args.op,)
    impls = args.implementations.split(",") if args.implementations else None
    for op in ops:
        entry = autotune.autotune(
            op,
            parse_dims(args.dims),
            dtype=args.dtype,
            implementations=impls,
            interpret=args.interpret,
            repeats=args.repeats,
            max_configs=args.max_configs,
            cache=_cache(args),
            record=not args.dry_run,
        )
        print(json.dumps({"op": op, **entry}, sort_keys=True))
    return 0


def _show(args) -> int:
    cache = _cache(args)
    print(
        json.dumps(
            {
                "user_cache": str(cache.user_path),
                "shipped": str(cache.shipped_path),
                "entries": cache.all_entries(),
            },
            indent=1,
            sort_keys=True,
        )
    )
    return 0


def _which(args) -> int:
    op = registry.api_module(args.op).OP
    example_args, options = op.example(parse_dims(args.dims), args.dtype)
    from jaxstack.kernlib._src import device, dispatch

    impl, cfg = dispatch.select(op, None, example_args, options, cache=_cache(args))
    print(
        json.dumps(
            {
                "device_kind": device.device_kind(),
                "op": args.op,
                "spec": op.spec(*example_args, **options),
                "implementation": impl.name,
                "config": None if cfg is None else cfg.to_dict(),
            },
            sort_keys=True,
        )
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxstack-kern", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tune = sub.add_parser("autotune", help="sweep implementations and block sizes, record winner")
    which = sub.add_parser("which", help="print the implementation None would choose here")
    for p in (tune, which):
        p.add_argument("--op", required=True, choices=[*registry.OP_NAMES, "all"])
        p.add_argument("--dims", default="", help="problem dims, e.g. batch=1,seq=2048")
        p.add_argument("--dtype", default="bfloat16")
        p.add_argument("--cache", default=None, help="user cache file (default: XDG cache)")
    tune.add_argument("--implementations", default=None, help="comma list (default: all)")
    tune.add_argument("--repeats", type=int, default=5)
    tune.add_argument("--max-configs", type=int, default=None)
    tune.add_argument("--interpret", action="store_true", help="Pallas interpreter (tests only)")
    tune.add_argument("--dry-run", action="store_true", help="time but do not record")
    show = sub.add_parser("show", help="print the merged tuning cache")
    show.add_argument("--cache", default=None)
    args = parser.parse_args(argv)
    if args.command == "which" and args.op == "all":
        parser.error("which needs one --op")
    try:
        return {"autotune": _autotune, "show": _show, "which": _which}[args.command](args)
    except ConfigError as e:
        print(f"jaxstack-kern: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
