"""Model surgery by path regex: find modules, replace them, freeze parameters.

Paths are the `/`-joined attribute paths of the module graph (`layers/0/attn/q_proj`; with
scanned layers `layers/attn/q_proj`). Patterns are matched with `re.search`, so anchor them
(`^layers/\\d+/attn/`) when you mean it. A pattern that matches nothing is an error: a typo
must not silently train or freeze the wrong thing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import jax
from flax import nnx

from jaxstack.nnlib._src.errors import SurgeryError
from jaxstack.nnlib._src.paths import param_path


class Frozen(nnx.Variable):
    """A parameter excluded from training: not an nnx.Param, so as_function leaves it out."""


def iter_modules(model: nnx.Module) -> Iterator[tuple[str, nnx.Module]]:
    """(path, module) for every submodule (the root has path "")."""
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module):
            yield param_path(path), node


def _matching(model: nnx.Module, pattern: str, kind: type | None = None) -> list[tuple[str, Any]]:
    rx = re.compile(pattern)
    found = [
        (p, m)
        for p, m in iter_modules(model)
        if p and rx.search(p) and (kind is None or isinstance(m, kind))
    ]
    if not found:
        raise SurgeryError(
            f"pattern {pattern!r} matched no {'module' if kind is None else kind.__name__}; "
            f"module paths look like {[p for p, _ in iter_modules(model) if p][:6]}"
        )
    return found


def _get(node: Any, key: str) -> Any:
    return node[int(key)] if isinstance(node, nnx.List) else getattr(node, key)


def replace_module(
    model: nnx.Module, pattern: str, factory: Callable[[str, nnx.Module], nnx.Module]
) -> list[str]:
    """Replace each module whose path matches `pattern` by `factory(path, old_module)`.

    Returns the replaced paths. Nested matches are replaced outermost first; modules inside a
    replaced one are not visited again.
    """
    paths = [p for p, _ in _matching(model, pattern)]
    done: list[str] = []
    for path in paths:
        if any(path.startswith(d + "/") for d in done):
            continue
        *parents, last = path.split("/")
        parent = model
        for k in parents:
            parent = _get(parent, k)
        new = factory(path, _get(parent, last))
        if isinstance(parent, nnx.List):
            parent[int(last)] = new
        else:
            setattr(parent, last, new)
        done.append(path)
    return done


def freeze(model: nnx.Module, pattern: str) -> list[str]:
    """Turn every nnx.Param whose parameter path matches `pattern` into a `Frozen` variable.

    Frozen values still take part in the forward pass but are no longer in
    `as_function(model)[1]`, so they get no gradients and no optimiser state. Returns the
    frozen parameter paths.
    """
    rx = re.compile(pattern)
    frozen = []
    for mpath, module in list(iter_modules(model)):
        for name, value in list(vars(module).items()):
            if type(value) is nnx.Param:
                path = f"{mpath}/{name}" if mpath else name
                if rx.search(path):
                    setattr(module, name, Frozen(value[...], **value.get_metadata()))
                    frozen.append(path)
    if not frozen:
        raise SurgeryError(f"freeze pattern {pattern!r} matched no parameter path")
    return frozen


def unfreeze(model: nnx.Module, pattern: str = "") -> list[str]:
    """Turn Frozen variables whose path matches `pattern` back into nnx.Param."""
    rx = re.compile(pattern)
    out = []
    for mpath, module in list(iter_modules(model)):
        for name, value in list(vars(module).items()):
            if isinstance(value, Frozen):
                path = f"{mpath}/{name}" if mpath else name
                if rx.search(path):
                    setattr(module, name, nnx.Param(value[...], **value.get_metadata()))
                    out.append(path)
    return out


def init_from(model: nnx.Module, source: Any, pattern: str = "") -> list[str]:
    """Partial init: copy every parameter whose path matches `pattern` from `source`.

    `source` is another module, an nnx.State, or a flat {path: array} dict (e.g. read from a
    safetensors file). Only paths present in both are copied; a shape mismatch or a pattern
    that copies nothing raises SurgeryError. Returns the copied paths.
    """
    from jaxstack.nnlib._src.paths import flat_arrays, iter_variables

    if isinstance(source, nnx.Module):
        source = nnx.state(source, nnx.Any(nnx.Param, Frozen))
    if isinstance(source, dict) and all(
        isinstance(k, str) and not isinstance(v, dict) for k, v in source.items()
    ):
        arrays = source  # already flat: {path: array}
    else:
        arrays = flat_arrays(source)
    rx = re.compile(pattern)
    state = nnx.state(model, nnx.Any(nnx.Param, Frozen))
    copied = []
    for path, var in iter_variables(state):
        if path in arrays and rx.search(path):
            value = arrays[path]
            if tuple(value.shape) != tuple(var.shape):
                raise SurgeryError(
                    f"init_from: {path!r} has shape {tuple(value.shape)} in the source, "
                    f"{tuple(var.shape)} in the model"
                )
            var[...] = jax.numpy.asarray(value, var.dtype)
            copied.append(path)
    if not copied:
        raise SurgeryError(
            f"init_from pattern {pattern!r} copied nothing: no shared parameter path"
        )
    nnx.update(model, state)
    return copied
