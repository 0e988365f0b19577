"""`jaxstack-quant`: post-training quantisation of a trained run, and evaluation.

    jaxstack-quant ptq RUN_OR_CHECKPOINT --rules int8|w8a8|int4|nf4|RULES.yaml --out DIR
                       [--calibration N] [--step S]
    jaxstack-quant eval DIR_OR_RUN [--data PATH] [--batches N] [--batch-size B]

Bad input (a path that is not a run, a rules file that does not parse, an output directory
that exists) is one line on stderr and exit status 2, with nothing written.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import sys
import warnings
from collections.abc import Sequence

from jaxstack import ckptlib, datalib
from jaxstack.quantlib._src.errors import Error, SourceError

PROG = "jaxstack-quant"
# The keys of rules.PRESETS, named here so that --help answers without importing JAX (rules.py
# builds the presets with JAX); a test keeps the two the same.
PRESET_NAMES = ("int8", "w8a8", "int4", "nf4")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ptq = sub.add_parser("ptq", help="quantise a run directory or checkpoint")
    ptq.add_argument("source", help="a jaxstack-train run directory or ckptlib checkpoint dir")
    ptq.add_argument(
        "--rules", required=True, help=f"a preset ({', '.join(PRESET_NAMES)}) or a YAML rules file"
    )
    ptq.add_argument("--out", required=True, help="new output directory")
    ptq.add_argument(
        "--calibration",
        type=int,
        default=0,
        metavar="N",
        help="calibrate static activation scales on N training batches",
    )
    ptq.add_argument("--step", type=int, default=None, help="checkpoint step (default newest)")
    ev = sub.add_parser("eval", help="validation perplexity of a quantised directory or a run")
    ev.add_argument("path", help="a directory written by `ptq`, or a run directory (float)")
    ev.add_argument("--data", default=None, help="text file or folder (default: the run's data)")
    ev.add_argument("--batches", type=int, default=16)
    ev.add_argument("--batch-size", type=int, default=8)
    ev.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _ptq(args: argparse.Namespace) -> None:
    from jaxstack.quantlib._src import evaluate, source, store
    from jaxstack.quantlib._src.quantize import PtqProvider, quantize, weight_bytes
    from jaxstack.quantlib._src.rules import load_rules

    rules = load_rules(args.rules)
    if args.calibration < 0:
        raise SourceError(f"--calibration {args.calibration}: use a number of batches >= 0")
    src = source.load_run(args.source, args.step)
    calibration = None
    if args.calibration:
        batches = evaluate.validation_batches(
            src.tokenizer,
            seq_len=src.seq_len,
            batch_size=int(src.data.get("batch_size", 8)),
            data_path=src.data.get("path"),
            split="train",
        )
        calibration = list(itertools.islice(batches, args.calibration))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        qmodel = quantize(src.model, PtqProvider(rules), calibration=calibration)
    for w in caught:
        print(f"{PROG}: warning: {w.message}", file=sys.stderr)
    info = {
        "source": src.path,
        "step": src.step,
        "tokenizer": src.tokenizer_spec,
        "seq_len": src.seq_len,
        "data": {k: src.data.get(k) for k in ("path", "validation_path")},
        "calibration_batches": args.calibration,
        "weight_bytes": weight_bytes(qmodel),
        "float_weight_bytes": weight_bytes(src.model)["total"],
    }
    out = store.save_quantized(
        qmodel, args.out, rules=rules, model_config=src.model_config, info=info, step=src.step
    )
    b = info["weight_bytes"]
    print(
        f"quantised {src.path} (step {src.step}) -> {out}: weights {info['float_weight_bytes']:,}"
        f" -> {b['total']:,} bytes (quantised modules {b['quantized_float']:,} -> "
        f"{b['quantized']:,})"
    )


def _eval(args: argparse.Namespace) -> None:
    from jaxstack.quantlib._src import evaluate, source, store

    if args.batches < 1 or args.batch_size < 1:
        raise SourceError("--batches and --batch-size must be >= 1")
    if (pathlib.Path(args.path) / store.INFO_FILE).is_file():
        model, record = store.load_quantized(args.path)
        tokenizer = source.build_tokenizer(record["tokenizer"])
        seq_len, data = record["seq_len"], record.get("data") or {}
    else:
        src = source.load_run(args.path)
        model, tokenizer, seq_len, data = src.model, src.tokenizer, src.seq_len, src.data
    if args.data is not None and not pathlib.Path(args.data).exists():
        raise SourceError(f"--data {args.data}: no such file or folder")
    data_path = args.data or data.get("validation_path") or data.get("path")
    batches = evaluate.validation_batches(
        tokenizer, seq_len=seq_len, batch_size=args.batch_size, data_path=data_path
    )
    result = evaluate.perplexity(model, batches, args.batches)
    result["data"] = data_path or "default corpus (validation split)"
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{args.path}: perplexity {result['perplexity']:.4f} (loss {result['loss']:.4f} "
            f"over {int(result['tokens'])} tokens of {result['data']})"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        (_ptq if args.command == "ptq" else _eval)(args)
    except (Error, ckptlib.Error, datalib.Error) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
