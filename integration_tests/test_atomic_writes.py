"""Every package's file writers behave alike under a full disk and after a clean write.

A concept the packages share but may not import from one another (the layers forbid a
foundation package importing a sibling) is checked here once for all of them: each public
writer below runs in its own process, first to write a previous version, then again with the
process's files capped at LIMIT bytes (RLIMIT_FSIZE: a write past it fails with EFBIG, as on a
full disk), then once more uncapped. The capped write must fail with the disk's error (the
process survives it), leave the folder exactly as it was (the previous version intact, no
temporary file left), and the last write must replace the previous version, leave nothing
else behind, and give the file (or folder) the permissions the umask allows, as `open` would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from commands import environment

LIMIT = 512  # bytes: below every case's new content, so the capped write always hits it

# name -> (target, relative to the case's folder; code defining `writer(target, version)`,
# which prepares everything and returns a zero-argument function that only writes)
CASES = {
    "ckptlib.save_safetensors": (
        "weights.safetensors",
        """
        import numpy as np
        from jaxstack import ckptlib
        def writer(target, version):
            params = {"w": np.full(4096, version, np.float32)}
            return lambda: ckptlib.save_safetensors(params, target)
    """,
    ),
    "nnlib.save_hf_checkpoint": (
        "hf",
        """
        from flax import nnx
        from jaxstack import nnlib
        def writer(target, version):
            model = nnlib.Transformer(nnlib.get_preset("tiny").replace(
                num_layers=1, d_model=32, num_heads=2, num_kv_heads=2, head_dim=16, mlp_dim=64,
                vocab_size=64), rngs=nnx.Rngs(version))
            return lambda: nnlib.save_hf_checkpoint(model, target)
    """,
    ),
    "datalib.write_array_record": (
        "docs.array_record",
        """
        from jaxstack import datalib
        def writer(target, version):
            docs = [f"document {i} of version {version} " * 8 for i in range(64)]
            return lambda: datalib.write_array_record(target, docs)
    """,
    ),
    "datalib.BPETokenizer.save": (
        "tokenizer.json",
        """
        from jaxstack import datalib
        def writer(target, version):
            text = [f"the quick brown fox {version} jumps over the lazy dog " * 20] * 20
            tokenizer = datalib.BPETokenizer.train(text, vocab_size=300 + version)
            return lambda: tokenizer.save(target)
    """,
    ),
    "xprof_lite.save_hlo": (
        "logs",
        """
        import jax, jax.numpy as jnp
        from jaxstack import xprof_lite
        def writer(target, version):
            compiled = jax.jit(lambda x: jnp.tanh(x) * version).lower(jnp.ones(8)).compile()
            return lambda: xprof_lite.save_hlo(target, compiled)
    """,
    ),
    "trainer.Config.save": (
        "config.yaml",
        """
        from jaxstack import trainer
        def writer(target, version):
            config = trainer.load_config("tiny", [f"train.steps={100 + version}"])
            return lambda: config.save(target)
    """,
    ),
    "trainer.write_report": (
        "report.html",
        """
        import json
        import matplotlib.pyplot
        from jaxstack import trainer
        def writer(target, version):
            rows = [{"kind": "train", "step": s, "loss": 5.0 - s / (10 + version)}
                    for s in range(1, 20)]
            (target.parent / "metrics.jsonl").write_text(
                "".join(json.dumps(r) + "\\n" for r in rows))
            return lambda: trainer.write_report(target.parent)
    """,
    ),
}

RUNNER = """
import errno, json, os, pathlib, resource, signal, stat, sys
exec(sys.argv[1])
target, limit = pathlib.Path(sys.argv[2]), int(sys.argv[3])
folder = target.parent

def snapshot():
    return {str(p.relative_to(folder)): p.read_bytes().hex() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}

def modes():
    return {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*")}

writer(target, 1)()
write = writer(target, 2)  # prepares (its inputs may change the folder), writes nothing
before = snapshot()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
try:
    write()
    error = None
except Exception as e:
    chain, error = [], e
    while e is not None:
        chain.append(getattr(e, "errno", None) == errno.EFBIG or "File too large" in str(e))
        e = e.__cause__ or e.__context__
    error = {"type": type(error).__name__, "message": str(error)[:300], "disk": any(chain)}
finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
after_full = snapshot()
writer(target, 3)()
umask = os.umask(0); os.umask(umask)
print(json.dumps({"error": error, "kept": after_full == before, "before": sorted(before),
                  "after_full": sorted(after_full), "after": sorted(snapshot()),
                  "changed": snapshot() != before, "modes": modes(), "umask": umask}))
"""


@pytest.mark.parametrize("case", sorted(CASES))
def test_writer_keeps_the_previous_version_on_a_full_disk(case, tmp_path):
    target, code = CASES[case]
    folder = tmp_path / "out"
    folder.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, textwrap.dedent(code), str(folder / target), str(LIMIT)],
        env=environment(JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"the writing process died:\n{done.stderr[-3000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    error = result["error"]
    assert error is not None, "the capped write succeeded: LIMIT is above the case's content"
    assert error["disk"], f"failed, but not because of the disk: {error}"
    assert result["kept"], (
        f"a failed write changed the folder: {result['before']} -> {result['after_full']}"
    )
    assert result["changed"], "the uncapped write did not replace the previous version"
    assert result["after"] == result["before"], f"files left behind: {result['after']}"
    allowed = {True: 0o777 & ~result["umask"], False: 0o666 & ~result["umask"]}
    folders = {n for n in result["before"] if (folder / n).is_dir()}
    wrong = {n: oct(m) for n, m in result["modes"].items() if m != allowed[n in folders]}
    assert not wrong, f"permissions other than the umask's {oct(result['umask'])}: {wrong}"
