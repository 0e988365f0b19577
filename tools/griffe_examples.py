"""griffe extension for the docs: a docstring's `Example:` section is read as `Examples:`.

The packages follow Optax's docstrings, which head a runnable example with `Example:`. Griffe's
Google-style parser knows only the plural as the examples section and would render the singular
as prose, turning `>>> f(x)[0]` into a broken Markdown link.
"""

from __future__ import annotations

import re

import griffe

SINGULAR = re.compile(r"^(\s*)Example:\s*$", re.M)


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = SINGULAR.sub(r"\1Examples:", obj.docstring.value)
