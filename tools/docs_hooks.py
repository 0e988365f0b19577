"""mkdocs hook: one API reference page per package, generated from the package's `__all__`, and
the benchmark results (RESULTS.md, each benchmark's results files and plots, the rounds
RESULTS.md summarises, the archived runs) published under `benchmarks/` so that the docs link
every number to the file it comes from. A guide's link to a benchmark as the repository lays it
out (`../benchmarks/quant` from docs/) is pointed at the
published page, so the same Markdown reads right on a forge and in the site.

Each public name is documented from the module that defines it (mkdocstrings reads the source
with griffe), under the name users import (`jaxstack.trainer.load_config`), so packages that
export names lazily (PEP 562) are covered too, and a name that cannot be found fails the build.
"""

from __future__ import annotations

import importlib
import posixpath
import re
import sys
import types
from pathlib import Path

from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workspace import ROOT, all_packages

# RESULTS.md links every round it summarises (`<benchmark>/runs/<machine kind>/round-<n>/`), and
# the benchmarks' READMEs link their archived one-off runs and A/B files: all are published.
PUBLISHED_RESULTS = ("RESULTS.md", "*/*.json", "*/quick/results.*", "*/*.md", "*/*.png",
                     "plots/*.png", "*/runs/*/round-*/results*.md",
                     "*/runs/*/round-*/results*.json", "*/archive/**/*.md",
                     "*/archive/**/*.json")  # fmt: skip


def defining_path(package, name: str) -> str:
    """The dotted path, inside the package, where the source defines `package.name`."""
    value = getattr(package, name)
    if isinstance(value, types.ModuleType):  # a public submodule (`jaxstack.rl.arithmetic`)
        return value.__name__
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if callable(value) and qualname and (module or "").startswith(package.__name__ + "."):
        return f"{module}.{qualname}"
    owners = [
        module_name
        for module_name, module in sorted(sys.modules.items())
        if module_name.startswith(package.__name__ + ".")
        and getattr(module, name, None) is value
        and name in getattr(module, "__dict__", {})
    ]
    if not owners:
        raise LookupError(f"{package.__name__}.{name}: no module of the package defines it")
    return f"{owners[-1]}.{name}"


# A constant whose value prints longer than this is shown without it (name, type, docstring).
LONGEST_SHOWN_VALUE = 120


def reference_page(import_name: str) -> str:
    package = importlib.import_module(import_name)
    summary = (package.__doc__ or "").strip().split("\n\n")[0]
    lines = [f"# {import_name}", "", summary, ""]
    for name in package.__all__:
        lines += [
            f"::: {defining_path(package, name)}",
            "    options:",
            f'      heading: "{import_name}.{name}"',
            f'      toc_label: "{name}"',
        ]
        if len(repr(getattr(package, name))) > LONGEST_SHOWN_VALUE:
            # A table or a template: its docstring says what it holds; the heading stays short.
            lines.append("      show_attribute_values: false")
        lines.append("")
    return "\n".join(lines)


def on_files(files, config):
    for package in all_packages():
        import_name = "jaxstack." + package.folder.replace("-", "_")
        files.append(
            File.generated(
                config, f"reference/{package.folder}.md", content=reference_page(import_name)
            )
        )
    benchmarks = ROOT / "benchmarks"
    published = sorted(
        {
            path
            for pattern in PUBLISHED_RESULTS
            for path in benchmarks.glob(pattern)
            if not any(part.endswith(".partial") for part in path.parts)  # an unfinished sitting
        }
    )
    for path in published:
        uri = path.relative_to(ROOT).as_posix()
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown, page, config, files):
    page_dir = posixpath.dirname(page.file.src_uri)
    docs_dir = Path(config["docs_dir"]).resolve().relative_to(ROOT).as_posix()

    def published(match: re.Match) -> str:
        target, anchor = match.group(1), match.group(2) or ""
        in_repo = posixpath.normpath(posixpath.join(docs_dir, page_dir, target))
        if "://" in target or not in_repo.startswith("benchmarks"):
            return match.group(0)
        if (ROOT / in_repo).is_dir():
            index = next(
                (
                    f"{in_repo}/{n}"
                    for n in ("README.md", "results.md")
                    if (ROOT / in_repo / n).exists()
                ),
                None,
            )
            if index is None:
                return match.group(0)
            in_repo = index
        if files.get_file_from_path(in_repo) is None:
            return match.group(0)
        return f"]({posixpath.relpath(in_repo, page_dir or '.')}{anchor})"

    return LINK.sub(published, markdown)
