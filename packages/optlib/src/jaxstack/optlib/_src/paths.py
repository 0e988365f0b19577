"""Parameter paths: the `/`-joined keys that name a leaf of any parameter PyTree.

Masks, learning-rate multipliers and frozen sets are written as regexes over these paths, so one
config works for a nested dict and for a Flax NNX `State` alike. The path follows the project's
convention: `jax.tree_util.keystr(key_path, simple=True, separator="/")` after dropping a final
`GetAttrKey("value")`, the attribute under which a Flax NNX `Variable` keeps its array (so
`layers/0/kernel`, not `layers/0/kernel/value`; a dict key named "value" is a real name and
stays). optlib needs no knowledge of Flax for it.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

from jaxstack.optlib._src.errors import ConfigError, UnmatchedRegexWarning

PyTree = Any

_VARIABLE_VALUE = jax.tree_util.GetAttrKey("value")


def path_to_str(key_path: Sequence[Any]) -> str:
    """The leaf path of a JAX key path: `layers/0/kernel`, `0/mu/layers/0/kernel`."""
    keys = tuple(key_path)
    if keys and keys[-1] == _VARIABLE_VALUE:
        keys = keys[:-1]
    return jax.tree_util.keystr(keys, simple=True, separator="/")


def param_paths(tree: PyTree) -> PyTree:
    """A PyTree of the same structure as `tree` whose leaves are the leaves' path strings.

    Example:
        >>> param_paths({"layers": [{"kernel": 1}], "norm": {"scale": 2}})
        {'layers': [{'kernel': 'layers/0/kernel'}], 'norm': {'scale': 'norm/scale'}}
    """
    return jax.tree_util.tree_map_with_path(lambda kp, _: path_to_str(kp), tree)


def compile_regexes(patterns: Iterable[str], field: str) -> list[re.Pattern[str]]:
    """Compiles config regexes, turning a bad one into a ConfigError that names it."""
    compiled = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise ConfigError(f"{field}: {pattern!r} is not a regex string; write it as a string")
        try:
            compiled.append(re.compile(pattern))
        except re.error as error:
            raise ConfigError(f"{field}: {pattern!r} is not a valid regex ({error})") from None
    return compiled


def first_match(path: str, regexes: Sequence[re.Pattern[str]]) -> int | None:
    """Index of the first regex that `re.search`es `path`, or None."""
    for index, regex in enumerate(regexes):
        if regex.search(path):
            return index
    return None


def warn_unmatched(paths: Iterable[str], patterns: Sequence[str], field: str) -> list[str]:
    """Warns once per regex of `field` that matches none of `paths`; returns those regexes."""
    paths = list(paths)
    unmatched = [p for p in patterns if not any(re.search(p, path) for path in paths)]
    for pattern in unmatched:
        warnings.warn(
            f"{field}: regex {pattern!r} matches no parameter path (e.g. {paths[:3]}); "
            "check it for a typo",
            UnmatchedRegexWarning,
            stacklevel=3,
        )
    return unmatched


def path_labels(label_of: Callable[[str], Any]) -> Callable[[PyTree], PyTree]:
    """A params -> labels function (for optax masks and partitions) driven by leaf paths.

    It is a function of the params, not a fixed tree, so the resulting transformation works on
    any PyTree with the same paths: a dict, an NNX State, or their `jax.ShapeDtypeStruct`
    stand-ins under `jax.eval_shape`.
    """

    def labels(params: PyTree) -> PyTree:
        return jax.tree_util.tree_map_with_path(lambda kp, _: label_of(path_to_str(kp)), params)

    return labels
