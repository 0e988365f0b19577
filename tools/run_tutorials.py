"""Runs the tutorials (docs/tutorials/*.md) from start to end, as a reader would: every `bash`
and `python` block of each page, in order, in one working directory shared by all pages (the
later tutorials start from the run the first one trains). `nox -s docs-tutorials` runs this.

Each page becomes one bash script (`set -euo pipefail`): bash blocks as they are, python blocks
as `python - <<'EOF'` heredocs, so a server a block starts with `&` is still there for the next
block, and is stopped when the page ends. Blocks in other languages (yaml, json: file contents
and outputs) are not run. The one liberty taken with the text: a server's port (`--port 8000`,
`127.0.0.1:8000`) becomes a free one, so that the run never meets another server on 8000.

    python tools/run_tutorials.py                   # all pages, in a temporary directory
    python tools/run_tutorials.py --workdir /tmp/t  # keep what they wrote
    python tools/run_tutorials.py --only train --only quantise

A page fails on the first command that fails, or after --timeout seconds; the pages after it
are not run (they start from what it makes), the exit status is 1 and the log says which block
it was in.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "docs" / "tutorials"
# The order of the site's navigation: each page may use what the pages before it made.
ORDER = ("train", "finetune", "quantise", "serve-llm", "profile", "serve-models")
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
RUN = ("bash", "python")
PORT = re.compile(r"(?<=--port )8000\b|(?<=127\.0\.0\.1:)8000\b")
HEREDOC_END = "JAXSTACK_TUTORIAL_PYTHON"


def blocks(page: Path) -> list[tuple[str, int, str]]:
    """The (language, line, code) of each bash and python block of a page, in order."""
    text = page.read_text()
    return [
        (m.group(1), text.count("\n", 0, m.start()) + 1, m.group(2))
        for m in FENCE.finditer(text)
        if m.group(1) in RUN
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def script(page: Path) -> str:
    """The page as one bash script; background jobs are ended when it exits."""
    port = free_port()
    lines = [
        "set -euo pipefail",
        "trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true' EXIT",
    ]
    for language, line, code in blocks(page):
        code = PORT.sub(str(port), code)
        lines.append(f"echo '>>> {page.name}:{line} ({language})'")
        if language == "bash":
            lines.append(code.rstrip("\n"))
        else:
            lines += [f"python - <<'{HEREDOC_END}'", code.rstrip("\n"), HEREDOC_END]
    return "\n".join(lines) + "\n"


def run_page(page: Path, workdir: Path, timeout: float) -> tuple[bool, float]:
    path = workdir / f".tutorial-{page.stem}.sh"
    path.write_text(script(page))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    # A new session, so that a timeout ends the page's servers too, not only its shell.
    process = subprocess.Popen(["bash", str(path)], cwd=workdir, env=env, start_new_session=True)
    try:
        ok = process.wait(timeout=timeout) == 0
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()
        print(f"!!! {page.name}: still running after {timeout:.0f} s, stopped", flush=True)
        ok = False
    return ok, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="where the pages run (default: a temp dir)")
    parser.add_argument("--only", action="append", choices=ORDER, help="run only these pages")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per page")
    args = parser.parse_args(argv)
    unlisted = sorted({p.stem for p in TUTORIALS.glob("*.md")} - set(ORDER))
    if unlisted:
        print(f"tutorials not in ORDER of {__file__}: {unlisted}; add them", file=sys.stderr)
        return 1
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="jaxstack-tutorials-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for name in [n for n in ORDER if not args.only or n in args.only]:
        page = TUTORIALS / f"{name}.md"
        print(f"=== {page.relative_to(ROOT)} ({len(blocks(page))} blocks) in {workdir}", flush=True)
        ok, seconds = run_page(page, workdir, args.timeout)
        results.append((name, ok, seconds))
        print(f"=== {name}: {'ok' if ok else 'FAILED'} in {seconds:.0f} s", flush=True)
        if not ok:  # the pages after it start from what it makes
            break
    for name, ok, seconds in results:
        print(f"{name:<14} {'ok' if ok else 'FAILED':<7} {seconds:6.0f} s")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
