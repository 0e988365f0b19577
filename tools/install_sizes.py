"""Each package's installed size and dependency count when installed alone, measured for real.

For every package: a fresh `uv venv`, then `uv pip install` of the package's folder with the
folders of the jaxstack siblings it needs (its declared dependencies, transitively; no extras),
third-party versions pinned by uv.lock as in the nox sessions. The distributions installed are
counted (`uv pip list`) and the site-packages folder is measured (every file once, hard links
included); each distribution's share comes from its RECORD, so the table can name the largest.

    .venv/bin/python tools/install_sizes.py            # print the table (~2-5 min, uv's cache warm)
    .venv/bin/python tools/install_sizes.py --write    # and put it into docs/architecture.md
    .venv/bin/python tools/install_sizes.py serving    # only the named packages (prints only)

Also here: `serving_core_dependencies()`, the names of every distribution that serving's core
install resolves to in uv.lock, which tools/tests/test_serving_dependencies.py compares with the
recorded list (`--record-serving` rewrites that list).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
from pathlib import Path

from workspace import ROOT, all_packages, closure

DOC = ROOT / "docs" / "architecture.md"
START, END = "<!-- install-sizes:start -->", "<!-- install-sizes:end -->"
SERVING_RECORD = ROOT / "tools" / "serving-dependencies.txt"
RECORD_HEADER = (
    "# Every distribution jaxstack-serving's core install resolves to in uv.lock (all platforms).\n"
    "# tools/tests/test_serving_dependencies.py fails when it changes; after a deliberate change\n"
    "# rewrite it with `.venv/bin/python tools/install_sizes.py --record-serving`.\n"
)


def uv() -> str:
    found = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if found is None:
        sys.exit("uv is not on PATH: install it (pip install uv) or put its folder on PATH")
    return found


def run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def lock_constraints(folder: Path) -> Path:
    target = folder / "constraints.txt"
    run(uv(), "export", "--frozen", "--all-packages", "--no-hashes", "--no-emit-workspace",
        "--quiet", "--project", str(ROOT), "-o", str(target))  # fmt: skip
    return target


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def tree_bytes(folder: Path, seen: set[tuple[int, int]]) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            info = os.lstat(os.path.join(root, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def distribution_bytes(site: Path) -> dict[str, int]:
    """Bytes of each installed distribution, from the files its RECORD lists."""
    sizes = {}
    for record in site.glob("*.dist-info/RECORD"):
        name = record.parent.name.split("-")[0].lower().replace("_", "-")
        total = 0
        with record.open(newline="") as f:
            for row in csv.reader(f):
                path = (site / row[0]).resolve() if row else None
                if path is not None and path.is_file():
                    total += path.stat().st_size
        sizes[name] = total
    return sizes


def measure(folder: str, workdir: Path, constraints: Path) -> dict:
    venv = workdir / folder
    run(uv(), "venv", "--quiet", "--python", sys.executable, str(venv))
    python = str(venv / "bin" / "python")
    paths = [str(p.path) for p in closure(folder)]
    start = time.perf_counter()
    run(uv(), "pip", "install", "--quiet", "--python", python, "-c", str(constraints), *paths)
    seconds = time.perf_counter() - start
    listed = json.loads(run(uv(), "pip", "list", "--python", python, "--format", "json"))
    names = sorted(d["name"].lower() for d in listed)
    site = site_packages(venv)
    shares = distribution_bytes(site)
    largest = sorted(shares.items(), key=lambda kv: -kv[1])[:3]
    row = {
        "package": folder,
        "distributions": len(names),
        "jaxstack": sum(n.startswith("jaxstack-") for n in names),
        "site_packages_mb": round(tree_bytes(site, set()) / 1e6, 1),
        "largest": [[n, round(b / 1e6, 1)] for n, b in largest],
        "install_s": round(seconds, 1),
        "names": names,
    }
    shutil.rmtree(venv)
    return row


def markdown(rows: list[dict], when: str) -> str:
    intro = (
        f"Measured {when} by `tools/install_sizes.py` (Linux x86-64, CPython "
        f"{sys.version.split()[0]}, versions pinned by uv.lock, no extras): a fresh venv per "
        "package with only the package and the siblings it needs; MB are 10^6 bytes."
    )
    lines = [
        START,
        textwrap.fill(intro, 100),
        "",
        "| package | distributions installed | of them jaxstack | site-packages MB | largest |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        largest = ", ".join(f"{n} {mb:g}" for n, mb in r["largest"])
        lines.append(
            f"| {r['package']} | {r['distributions']} | {r['jaxstack']} | "
            f"{r['site_packages_mb']:g} | {largest} |"
        )
    return "\n".join([*lines, END])


def write_doc(table: str) -> None:
    text = DOC.read_text()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        sys.exit(f"{DOC} has no {START} ... {END} block to replace")
    DOC.write_text(pattern.sub(lambda _: table, text))


def lock_packages() -> dict[str, dict]:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    return {p["name"]: p for p in lock["package"]}


def serving_core_dependencies() -> list[str]:
    """Every distribution jaxstack-serving's core install resolves to in uv.lock (any platform:
    markers are not evaluated), its jaxstack siblings included and itself not."""
    packages = lock_packages()
    found: set[str] = set()
    todo = [("jaxstack-serving", ())]
    while todo:
        name, extras = todo.pop()
        entry = packages[name]
        wanted = list(entry.get("dependencies", ()))
        for extra in extras:
            wanted += entry.get("optional-dependencies", {}).get(extra, ())
        for dep in wanted:
            key = (dep["name"], tuple(dep.get("extra", ())))
            if key not in found:
                found.add(key)
                todo.append(key)
    return sorted({name for name, _ in found} - {"jaxstack-serving"})


def recorded_serving_dependencies() -> list[str]:
    lines = SERVING_RECORD.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", help="package folders (default: all)")
    parser.add_argument("--write", action="store_true", help=f"replace the table in {DOC.name}")
    parser.add_argument("--json", type=Path, help="also write the rows (with names) here")
    parser.add_argument(
        "--record-serving", action="store_true", help=f"rewrite {SERVING_RECORD.name} and stop"
    )
    args = parser.parse_args()
    if args.record_serving:
        SERVING_RECORD.write_text(RECORD_HEADER + "\n".join(serving_core_dependencies()) + "\n")
        print(f"wrote {SERVING_RECORD}")
        return
    known = [p.folder for p in all_packages()]
    unknown = sorted(set(args.packages) - set(known))
    if unknown:
        parser.error(f"unknown packages {unknown}; the packages are {known}")
    if args.write and args.packages:
        parser.error("--write measures every package; leave out the package names")
    rows = []
    with tempfile.TemporaryDirectory(prefix="install-sizes-") as tmp:
        constraints = lock_constraints(Path(tmp))
        for folder in args.packages or known:
            rows.append(measure(folder, Path(tmp), constraints))
            r = rows[-1]
            print(
                f"{folder:12s} {r['distributions']:3d} distributions, "
                f"{r['site_packages_mb']:7.1f} MB ({r['install_s']} s)",
                file=sys.stderr,
            )
    table = markdown(rows, time.strftime("%Y-%m-%d", time.gmtime()))
    print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    if args.write:
        write_doc(table)
        print(f"wrote the table into {DOC}", file=sys.stderr)


if __name__ == "__main__":
    main()
