"""Check that a logdir written by `xprof_lite.trace` opens in the real XProf.

Two steps, because XProf and the jaxstack workspace live in different environments:

    .venv/bin/python benchmarks/prof/check_xprof_opens.py capture /tmp/xprof-check
    python3 -m venv /tmp/xprofvenv && /tmp/xprofvenv/bin/pip install xprof
    /tmp/xprofvenv/bin/python benchmarks/prof/check_xprof_opens.py open /tmp/xprof-check

The second step converts the capture with XProf's own tool pipeline (the code behind its web UI)
and writes `xprof_check.md` next to this script.
"""

from __future__ import annotations

import glob
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
TOOLS = ("overview_page", "trace_viewer@", "framework_op_stats", "op_profile", "hlo_stats")


def capture(logdir: str) -> None:
    import jax
    import jax.numpy as jnp

    from jaxstack import xprof_lite

    step = jax.jit(lambda w, x: jnp.tanh(x @ w).sum())
    w, x = jnp.ones((256, 256)), jnp.ones((64, 256))
    step(w, x).block_until_ready()
    with xprof_lite.trace(logdir) as cap:
        for i in range(3):
            with xprof_lite.step_annotation(i):
                step(w, x).block_until_ready()
    cap.save_hlo(step, w, x)
    print(cap.run_dir)


def open_with_xprof(logdir: str) -> None:
    import xprof.version
    from xprof.convert import raw_to_tool_data

    paths = sorted(glob.glob(f"{logdir}/plugins/profile/*/*.xplane.pb"))
    lines = [
        "# The xprof-lite logdir opens in XProf",
        "",
        f"XProf {xprof.version.__version__}, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC,"
        f" run `{Path(paths[-1]).parent.name}` (renamed by xprof-lite to `<ts>_<pid>_<n>`).",
        "",
        "| XProf tool | result |",
        "|---|---|",
    ]
    for tool in TOOLS:
        try:
            data, content_type = raw_to_tool_data.xspace_to_tool_data(paths[-1:], tool, {})
            result = f"ok, {len(data or b'')} bytes of {content_type}"
        except Exception as exc:  # report, do not stop: the table is the result
            result = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
        lines.append(f"| {tool} | {result} |")
    (HERE / "xprof_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    {"capture": capture, "open": open_with_xprof}[sys.argv[1]](sys.argv[2])
