"""`jaxstack-rl`: the command line.

    jaxstack-rl sft  --config my-sft.yaml data.path=chats.jsonl lora.rank=8
    jaxstack-rl dpo  --config my-dpo.yaml dpo.beta=0.1
    jaxstack-rl grpo --config arithmetic-grpo init.hf=runs/sft/model train.steps=100
    jaxstack-rl recipe arithmetic --run-dir runs/arith
    jaxstack-rl --list-configs

Errors a user can fix (unknown key, bad value, a malformed record, a raising reward) print one
line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from jaxstack.rl._src.config import ALGORITHMS, RLConfig, list_presets, load_config
from jaxstack.rl._src.errors import Error


def _at_least(low: int):
    """An argparse type: an integer >= `low`, the range the flag's help states."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}; give at least {low}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jaxstack-rl", description="Post-train a jaxstack model: SFT, DPO, ORPO, GRPO, PPO."
    )
    p.add_argument("--list-configs", action="store_true", help="list the shipped presets")
    p.add_argument(
        "--print-schema", action="store_true", help="print the config's JSON Schema and exit"
    )
    sub = p.add_subparsers(dest="command")
    for name in ALGORITHMS:
        s = sub.add_parser(name, help=f"run {name.upper()}")
        s.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.steps=100")
        s.add_argument("--config", help="preset name or YAML file")
        s.add_argument("--run-dir", help="run directory (default: runs/<algorithm>-<time>)")
        s.add_argument("--print-config", action="store_true", help="print the resolved config")
    r = sub.add_parser("recipe", help="run a built-in recipe end to end")
    r.add_argument("name", choices=["arithmetic"])
    r.add_argument("--run-dir", default="runs/arithmetic", help="folder for both stages")
    r.add_argument("--sft", action="append", default=[], help="override for the SFT stage")
    r.add_argument("--grpo", action="append", default=[], help="override for the GRPO stage")
    r.add_argument(
        "--num-eval", type=_at_least(500), default=500, help="held-out problems (>= 500)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """The `jaxstack-rl` command: `jaxstack-rl <sft|dpo|orpo|grpo|ppo> --config NAME [k=v ...]`,
    `jaxstack-rl recipe NAME` or `jaxstack-rl --list-configs` (see the module docstring).

    Args:
      argv: the arguments after the program name (default: `sys.argv[1:]`).

    Returns:
      The exit status: 0 on success, 2 for an error the user can fix (printed as one line).
    """
    parser = _parser()
    # Overrides may come before or after the options (argparse stops a "*" positional at the
    # first option), so leftovers of the form key=value are overrides too.
    args, rest = parser.parse_known_args(argv)
    unknown = [a for a in rest if a.startswith("-") or "=" not in a]
    if unknown or (rest and args.command in (None, "recipe")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or rest)}")
    if rest:
        args.overrides = [*args.overrides, *rest]
    try:
        return _main(parser, args)
    except Exception as e:
        from jaxstack.trainer import report_error

        return report_error("jaxstack-rl", e, Error)


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.list_configs or args.print_schema:
        schema = args.print_schema and json.dumps(RLConfig.config_schema(), indent=1)
        print(schema or "\n".join(list_presets()))
        return 0
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "recipe":
        from jaxstack.rl._src.recipe import run_arithmetic

        summary = run_arithmetic(
            args.run_dir, sft_overrides=args.sft, grpo_overrides=args.grpo, num_eval=args.num_eval
        )
        print(
            f"arithmetic: exact-match accuracy {summary['accuracy_sft']:.1%} after SFT -> "
            f"{summary['accuracy_grpo']:.1%} after GRPO ({summary['gain_points']:+.1f} points, "
            f"{summary['num_heldout_problems']} held-out problems) in "
            f"{summary['wall_s'] / 60:.1f} min; {args.run_dir}/recipe.json"
        )
        return 0
    overrides = list(args.overrides)
    if args.run_dir:
        overrides.append(f"log.run_dir={args.run_dir}")
    from jaxstack.trainer import report_warnings

    with report_warnings("jaxstack-rl"):
        config = load_config(args.command, args.config, overrides)
    if args.print_config:
        import yaml

        print(yaml.safe_dump(config.to_dict(), sort_keys=False))
        return 0
    from jaxstack import rl

    result = getattr(rl, args.command)(config)
    s = result.summary
    print(
        f"done: step {result.step}, loss {s.get('first_loss', float('nan')):.4f} -> "
        f"{s.get('final_loss', float('nan')):.4f}; run directory {result.run_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
