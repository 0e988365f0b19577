"""docs/reference/config.md is the page tools/config_reference.py writes from the schemas."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import config_reference


def test_the_config_reference_page_is_current():
    assert config_reference.PAGE.read_text() == config_reference.render(), (
        "docs/reference/config.md is stale: run python tools/config_reference.py"
    )


def test_the_page_gives_type_default_range_and_description_of_each_key():
    page = config_reference.render()
    assert (
        "| `train.steps` | int | `300` | >= 1 | Optimiser steps of the run. |" in page.splitlines()
    )
    assert "| `lora.dropout` | float | `0.0` | >= 0, < 1 |" in page
    assert '| `train.attention` | `"xla"` \\| `"kernlib"` | `"xla"` |' in page
    assert "### `roles.actor`" in page and "| `optim.learning_rate` | float |" in page
