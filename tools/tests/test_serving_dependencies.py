"""jaxstack-serving's core dependency set does not grow silently: the distributions its core
install resolves to in uv.lock are compared with tools/serving-dependencies.txt."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import install_sizes


def test_servings_core_dependencies_are_the_recorded_ones():
    resolved = set(install_sizes.serving_core_dependencies())
    recorded = set(install_sizes.recorded_serving_dependencies())
    added, removed = sorted(resolved - recorded), sorted(recorded - resolved)
    assert not added and not removed, (
        f"jaxstack-serving's core install now resolves to {len(resolved)} distributions, not the "
        f"{len(recorded)} recorded in tools/serving-dependencies.txt: added {added}, removed "
        f"{removed}. An optional feature's dependency belongs in an extra. If the change is "
        "meant, run `.venv/bin/python tools/install_sizes.py --record-serving` and "
        "`tools/install_sizes.py --write` (the size table in docs/architecture.md), and say why "
        "in packages/serving/CHANGELOG.md."
    )


LOCK = """
[[package]]
name = "jaxstack-serving"
dependencies = [{ name = "fastapi" }, { name = "jax", extra = ["cpu"] }]
[package.optional-dependencies]
plots = [{ name = "matplotlib" }]

[[package]]
name = "fastapi"
dependencies = [{ name = "starlette" }, { name = "pydantic" }]

[[package]]
name = "starlette"
dependencies = [{ name = "fastapi" }]

[[package]]
name = "pydantic"

[[package]]
name = "jax"
dependencies = [{ name = "numpy" }]
[package.optional-dependencies]
cpu = [{ name = "jaxlib" }]

[[package]]
name = "numpy"

[[package]]
name = "jaxlib"

[[package]]
name = "matplotlib"
"""


def test_the_resolved_set_follows_the_lock_through_extras_and_cycles(tmp_path, monkeypatch):
    (tmp_path / "uv.lock").write_text(LOCK)
    monkeypatch.setattr(install_sizes, "ROOT", tmp_path)
    # A dependency's extra counts (jax[cpu] -> jaxlib); serving's own extras do not.
    assert install_sizes.serving_core_dependencies() == [
        "fastapi", "jax", "jaxlib", "numpy", "pydantic", "starlette",
    ]  # fmt: skip


def test_a_new_dependency_is_reported_by_name(tmp_path, monkeypatch):
    (tmp_path / "uv.lock").write_text(LOCK.replace('name = "pydantic"\n', 'name = "pydantic"\n'
                                                   'dependencies = [{ name = "grain" }]\n')
                                      + '\n[[package]]\nname = "grain"\n')  # fmt: skip
    monkeypatch.setattr(install_sizes, "ROOT", tmp_path)
    monkeypatch.setattr(install_sizes, "SERVING_RECORD", tmp_path / "record.txt")
    (tmp_path / "record.txt").write_text(
        "# header\n" + "\n".join(["fastapi", "jax", "jaxlib", "numpy", "pydantic", "starlette"])
    )
    try:
        test_servings_core_dependencies_are_the_recorded_ones()
    except AssertionError as error:
        message = str(error)
    else:
        raise AssertionError("the added dependency went unnoticed")
    assert "added ['grain'], removed []" in message
    assert "tools/install_sizes.py --record-serving" in message
