"""`jaxstack-serve --model PATH`: an OpenAI-compatible server for an nnlib model."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Sequence

import uvicorn

from jaxstack import xprof_lite
from jaxstack.serving._src.errors import ConfigError, Error
from jaxstack.serving._src.http_server import DrainingServer, add_server_arguments


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jaxstack-serve",
        description="Serve an nnlib model (HF folder, jaxstack-train run or ckptlib checkpoint) "
        "over the OpenAI API with a paged KV cache and continuous batching.",
    )
    p.add_argument("--model", required=True, help="HF folder, run directory or checkpoint dir")
    p.add_argument("--served-model-name", help="the model id clients use (default: folder name)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("JAXSTACK_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1 (default: $JAXSTACK_API_KEY)",
    )
    p.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument(
        "--num-blocks",
        type=int,
        help="KV blocks, overriding the size in GiB (default: max-num-seqs full contexts, "
        "within --kv-cache-gib)",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--kv-cache-gib",
        type=float,
        default=4.0,
        help="most GiB of K and V cache when --num-blocks is not given (default 4, as "
        "vLLM's VLLM_CPU_KVCACHE_SPACE)",
    )
    size.add_argument(
        "--kv-cache-memory-bytes", type=int, help="the same budget in bytes (vLLM's option)"
    )
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="launch each step before the previous one's tokens are recorded (default: on)",
    )
    p.add_argument("--max-logprobs", type=int, default=20)
    p.add_argument(
        "--max-waiting-requests",
        type=int,
        default=256,
        help="queued requests beyond which new ones get 429",
    )
    p.add_argument("--max-request-bytes", type=int, default=1 << 20)
    p.add_argument(
        "--max-n", type=int, default=128, help="the largest n a request may ask for (400 above)"
    )
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a Jinja chat template for /v1/chat/completions instead of the model's own "
        "(chat_template.jinja or tokenizer_config.json); needed by an HF model without one",
    )
    p.add_argument(
        "--lora-modules",
        nargs="+",
        type=lora_module,
        default=[],
        metavar="NAME=PATH",
        help="LoRA adapters (PEFT folders) served over the model, each chosen by a request "
        "whose 'model' is its NAME; not merged into the model",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--host-allocator",
        choices=xprof_lite.HOST_ALLOCATORS,
        default="auto",
        help="keep freed host memory mapped ('retain') or not; 'auto' decides from "
        "the CPU (see jaxstack.xprof_lite.set_host_allocator)",
    )
    p.add_argument("--no-warmup", action="store_true", help="compile lazily, not at startup")
    add_server_arguments(
        p,
        drain_timeout=30.0,
        drain_help="seconds idle connections get after SIGTERM; streams in flight finish",
    )
    return p


def lora_module(text: str) -> tuple[str, str]:
    """NAME=PATH of --lora-modules."""
    name, sep, path = text.partition("=")
    if not (sep and name and path):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME=PATH (e.g. --lora-modules sql=runs/sql-lora/adapter)"
        )
    return name, path


def kv_cache_bytes(args: argparse.Namespace) -> int:
    """The KV cache budget in bytes: --kv-cache-memory-bytes, else --kv-cache-gib."""
    return args.kv_cache_memory_bytes or int(args.kv_cache_gib * 2**30)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    log = logging.getLogger("jaxstack.serving.llm")
    # Before JAX starts its backend: the setting applies to allocations made after it.
    allocator = xprof_lite.set_host_allocator(args.host_allocator)

    from jaxstack.serving._src.llm.async_engine import AsyncEngine
    from jaxstack.serving._src.llm.engine import EngineConfig, LLMEngine
    from jaxstack.serving._src.llm.loading import load_model
    from jaxstack.serving._src.llm.openai_server import create_llm_app

    try:
        loaded = load_model(args.model, chat_template=args.chat_template)
        config = EngineConfig(
            max_model_len=args.max_model_len,
            block_size=args.block_size,
            num_blocks=args.num_blocks,
            kv_cache_memory_bytes=kv_cache_bytes(args),
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_prefix_caching=not args.no_prefix_caching,
            async_scheduling=args.async_scheduling,
            max_logprobs=args.max_logprobs,
            seed=args.seed,
        )
        served_name = args.served_model_name or loaded.name
        adapters = dict(args.lora_modules)
        if len(adapters) != len(args.lora_modules) or served_name in adapters:
            raise ConfigError(
                f"--lora-modules names must differ from each other and from the served model "
                f"{served_name!r}"
            )
        engine = LLMEngine(
            loaded.model,
            loaded.tokenizer,
            config,
            eos_token_ids=loaded.eos_token_ids,
            adapters=adapters,
        )
    except Error as e:
        print(f"jaxstack-serve: {e}", file=sys.stderr)
        return 2
    if not args.no_warmup:
        log.info("compiling %d step programs", engine.runner.num_programs)
        engine.runner.warmup()
    app = create_llm_app(
        AsyncEngine(engine, max_waiting=args.max_waiting_requests),
        model_name=served_name,
        tokenizer=loaded.tokenizer,
        chat_template=loaded.chat_template,
        api_key=args.api_key,
        max_request_bytes=args.max_request_bytes,
        max_n=args.max_n,
    )
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
        sock.listen(2048)  # connections wait in the backlog until uvicorn accepts them
    except OSError as e:
        print(
            f"jaxstack-serve: cannot bind {args.host}:{args.port} ({e}); pick another --port",
            file=sys.stderr,
        )
        return 2
    print(
        f"serving {args.model} as {args.served_model_name or loaded.name} on "
        f"http://{args.host}:{sock.getsockname()[1]} (pid {os.getpid()}, host allocator "
        f"{allocator})",
        flush=True,
    )
    config = uvicorn.Config(app, log_level=args.log_level.lower(), access_log=False)
    DrainingServer(config, drain_s=args.drain_timeout).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
