"""docs/conventions.md stays true: every Python block in it runs, in order, in one namespace."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "conventions.md"


def test_every_python_block_of_the_conventions_runs():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 6
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
