"""`jaxstack-train`: the command line.

    jaxstack-train                                   # the main job: tiny model, default corpus
    jaxstack-train --config tiny model.num_layers=2 optim.lr=3e-4 train.steps=100
    jaxstack-train --config llama3-8b --dry-run --mesh fsdp=8
    jaxstack-train --config llama3-8b --aot-topology v5p-128   # compile for a TPU slice here
    jaxstack-train --list-configs

Exit statuses: 0 the run finished; 2 an error the user can fix (bad preset, unknown key or
value, batch not dividing the mesh, missing data), printed as one line naming the key or file
and the fix, with nothing written; 143 (SIGTERM) or 130 (SIGINT) the run was stopped by that
signal, after saving a checkpoint of the step it had reached when checkpointing is on, and
prints a `stopped:` line instead of `done:`. Rerunning the same command resumes.
"""

from __future__ import annotations

import time

_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

from jaxstack.trainer._src.config import Config, list_configs, load_config  # noqa: E402
from jaxstack.trainer._src.errors import ConfigError, report_error, report_warnings  # noqa: E402
from jaxstack.trainer._src.signals import STOP, Stopped, exit_status  # noqa: E402

MESH_AXES = ("data", "fsdp", "tensor", "expert")


def parse_mesh(text: str) -> dict[str, int]:
    """`"data=2,fsdp=4"` -> `{"data": 2, "fsdp": 4, "tensor": 1, "expert": 1}`."""
    sizes = dict.fromkeys(MESH_AXES, 1)
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        axis, _, value = part.partition("=")
        if axis not in sizes or not value.isdigit() or int(value) < 1:
            raise ConfigError(
                f"--mesh entry {part!r} is not axis=size with axis in {MESH_AXES} "
                "and a positive size, e.g. --mesh data=2,fsdp=4"
            )
        sizes[axis] = int(value)
    return sizes


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jaxstack-train",
        description="Train a language model with jaxstack (defaults: the tiny model on the "
        "built-in corpus, a few minutes on a CPU).",
        epilog="Exit status: 0 finished; 2 a config, data or resume error (one line names the "
        "key or file and the fix; nothing written); 143 stopped by SIGTERM, 130 stopped by "
        "SIGINT (a checkpoint of the step reached is saved first when checkpointing is on; "
        "rerun the same command to resume).",
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.num_layers=2")
    p.add_argument("--config", default="tiny", help="preset name or YAML path (default: tiny)")
    p.add_argument("--run-dir", help="run directory (default: runs/<UTC timestamp>)")
    p.add_argument("--dry-run", action="store_true", help="AOT-compile one step; allocate nothing")
    p.add_argument("--mesh", help="mesh for --dry-run (or the run), e.g. data=2,fsdp=4")
    p.add_argument(
        "--aot-topology",
        metavar="SLICE",
        help="compile the train step for a TPU slice (v5e-16, v6e-256, v5p-128) on this machine "
        "with libtpu; print memory per chip vs HBM, FLOPs, predicted step time and MFU",
    )
    p.add_argument("--list-configs", action="store_true", help="list the presets and exit")
    p.add_argument("--print-config", action="store_true", help="print the resolved config")
    p.add_argument(
        "--print-schema", action="store_true", help="print the config's JSON Schema and exit"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    # First thing, before JAX is imported (that takes seconds): SIGTERM/SIGINT are answered.
    """The `jaxstack-train` command (see the module docstring for its forms and exit statuses).

    Args:
      argv: the arguments after the program name (default: `sys.argv[1:]`).

    Returns:
      The exit status: 0 the run finished, 2 an error the user can fix (one line naming the key
      or file and the fix); a stop signal exits 143 (SIGTERM) or 130 (SIGINT) after saving.
    """
    STOP.install()
    try:
        return _main(_parser().parse_args(argv))
    except Stopped as e:
        where = e.detail or "during start-up, before the first step; nothing was saved"
        print(f"jaxstack-train: stopped by {e} {where}", file=sys.stderr)
        return exit_status(e.signum)
    except Exception as e:
        return report_error("jaxstack-train", e)
    finally:
        STOP.uninstall()


def _main(args: argparse.Namespace) -> int:
    if args.list_configs or args.print_schema:
        schema = args.print_schema and json.dumps(Config.config_schema(), indent=1)
        print(schema or "\n".join(list_configs()))
        return 0
    overrides = list(args.overrides)
    if args.run_dir:
        overrides.append(f"log.run_dir={args.run_dir}")
    mesh = parse_mesh(args.mesh) if args.mesh else None
    if mesh and not (args.dry_run or args.aot_topology):
        overrides += [f"mesh.{a}={n}" for a, n in mesh.items()]
    with report_warnings("jaxstack-train"):
        config = load_config(args.config, overrides)
    if args.print_config:
        import yaml

        print(yaml.safe_dump(config.to_dict(), sort_keys=False))
        return 0
    if args.aot_topology:
        for name, value in AOT_ENV.items():
            os.environ.setdefault(name, value)
        from jaxstack.trainer._src.aot import aot_train_compile, check_fits, format_aot_report

        report = aot_train_compile(config, args.aot_topology, mesh)
        print(format_aot_report(report))
        check_fits(report)
        return 0
    if args.dry_run:
        if mesh:
            _fake_cpu_devices(math.prod(mesh.values()))
        from jaxstack.trainer._src.dry_run import dry_run, format_report

        print(format_report(dry_run(config, mesh)))
        return 0
    add_xla_flags(config.train.xla_flags)
    from jaxstack.trainer._src.loop import train

    result = train(config, start_time=_START)
    s = result.summary
    if result.stopped:
        saved = (
            f"saved checkpoint step {result.step} in {result.run_dir / 'checkpoints'}"
            if result.saved_on_stop
            else "checkpointing is off, nothing was saved"
        )
        print(
            f"stopped: by {result.stopped} at step {result.step} of {config.train.steps}; "
            f"{saved}; rerun the same command to resume",
            file=sys.stderr,
        )
        return exit_status(result.stop_signal)
    if "first_loss" not in s:
        print(f"done: the run in {result.run_dir} had already finished step {result.step}")
        return 0
    print(
        f"done: step {result.step}, loss {s.get('first_loss', float('nan')):.3f} -> "
        f"{s.get('final_loss', float('nan')):.3f}, eval loss {s.get('eval_loss', float('nan')):.3f}"
        f", {s.get('median_tokens_per_sec', 0):,.0f} tokens/s; run directory {result.run_dir}"
    )
    return 0


COMPILE_DEVICE_LIMIT = 64
# a CPU host compiling for TPUs: no TPU metadata server to ask, and no lock on a chip to take
AOT_ENV = {"JAX_PLATFORMS": "cpu", "TPU_SKIP_MDS_QUERY": "1", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def add_xla_flags(extra: str | None) -> None:
    """Appends `train.xla_flags` to `XLA_FLAGS`, but flags set there already. XLA reads them when
    JAX starts its backend, so call this before the first computation (both CLIs do).

    Only for jaxlib >= 0.12, whose XLA knows them: an unknown flag would abort the process.
    """
    import importlib.metadata

    if not extra:
        return
    try:
        major, minor = (int(x) for x in importlib.metadata.version("jaxlib").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return
    if (major, minor) < (0, 12):
        return
    flags = os.environ.get("XLA_FLAGS", "")
    new = [f for f in extra.split() if f.split("=")[0] not in flags]
    if new:
        os.environ["XLA_FLAGS"] = " ".join([flags, *new]).strip()


def _fake_cpu_devices(n: int) -> None:
    """Lets a CPU-only dry run compile for an n-device mesh (XLA reads this at backend start)."""
    flags = os.environ.get("XLA_FLAGS", "")
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if n > COMPILE_DEVICE_LIMIT or "force_host_platform_device_count" in flags:
        return
    if platforms and platforms != "cpu":
        return
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


if __name__ == "__main__":
    sys.exit(main())
