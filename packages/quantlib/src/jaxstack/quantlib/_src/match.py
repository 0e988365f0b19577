"""Applying rules to a model: which module each QuantRule picks, by a regex over module paths.

Module paths are the `/`-joined attribute paths of the model's module graph
(`layers/0/attn/q_proj`), matched with `re.search` like nnlib's surgery patterns. Only modules
that own a `kernel` (nnlib's Dense, Flax NNX's Linear and Einsum, or any module of that shape)
are candidates; the first rule that matches a module wins.
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Iterator, Sequence

from flax import nnx

from jaxstack.quantlib._src.errors import QuantWarning, RuleError
from jaxstack.quantlib._src.rules import QuantRule


def iter_candidates(model: nnx.Module) -> Iterator[tuple[str, nnx.Module]]:
    """(path, module) for every module that owns a `kernel` variable."""
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module) and isinstance(getattr(node, "kernel", None), nnx.Variable):
            yield "/".join(str(k) for k in path), node


def match_rules(
    model: nnx.Module, rules: Sequence[QuantRule]
) -> list[tuple[str, nnx.Module, QuantRule]]:
    """(path, module, rule) for each candidate module; the first matching rule wins.

    A rule that matches no module is a QuantWarning naming the nearest module paths.
    """
    if not rules:
        raise RuleError("no quantisation rules given; pass at least one QuantRule")
    compiled = [(re.compile(r.module_path), r) for r in rules]
    candidates = list(iter_candidates(model))
    used: set[int] = set()
    matches = []
    for path, module in candidates:
        for i, (rx, rule) in enumerate(compiled):
            if rx.search(path):
                used.add(i)
                if rule.quantizes:
                    matches.append((path, module, rule))
                break
    paths = [p for p, _ in candidates]
    for i, rule in enumerate(rules):
        if i not in used:
            near = difflib.get_close_matches(rule.module_path, paths, n=3, cutoff=0.0)
            warnings.warn(
                f"quantisation rule {i} (module_path={rule.module_path!r}) matched no module"
                f"{' before an earlier rule' if _searches_any(rule, paths) else ''}; "
                f"nearest module paths: {near}",
                QuantWarning,
                stacklevel=3,
            )
    return matches


def _searches_any(rule: QuantRule, paths: list[str]) -> bool:
    return any(re.search(rule.module_path, p) for p in paths)
