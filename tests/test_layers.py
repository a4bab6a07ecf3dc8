"""The packages form layers: each may import only the packages written below it here.

`DEPENDS` is the one place the allowed imports are written down. Each package names the
packages it builds on directly; it may import those and, transitively, whatever they build
on. Every `import`/`from ... import` of `ratrain` counts, inside functions too, so a lazy
import cannot hide a loop. The table itself must be acyclic, so no entry can allow a loop.
The pure layers import no torch at all (the subprocess tests beside each package check
that importing them loads none; this one checks every import statement). Only `cli/`
parses command lines: nothing below it imports argparse (`argparse_below_cli`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "ratrain"

# package (or top-level module) -> the packages it builds on directly
DEPENDS: dict[str, set[str]] = {
    # the base: no ratrain imports, or only each other
    "errors": set(),
    "deadline": set(),
    "gcpause": set(),
    "yaml_io": {"errors"},
    "ranks": set(),
    "schema": {"errors"},
    # pure: specs and platform data, the plan, the bytes of each training state
    "models": {"errors"},
    "platforms": {"yaml_io"},
    "config": {"models", "yaml_io", "ranks", "schema"},
    "sizes": {"config"},
    # pure: the schedule IR and its three torch-free readers, then the planner
    "schedule": {"sizes", "deadline", "gcpause"},
    "memory": {"schedule"},
    "cost": {"schedule", "platforms"},
    "sim": {"cost", "memory"},
    "planner": {"sim"},
    # torch: execution backends, the model, data, processes, observation
    "kernels": {"cost"},
    "nn": {"kernels", "models"},
    "data": {"models"},
    "launch": {"errors", "ranks"},
    "observe": {"sim"},
    # torch: step execution, its checkpoint component, then whole jobs
    "runtime": {"nn", "data", "launch", "observe", "schedule"},
    "checkpoint": {"runtime"},
    "train": {"checkpoint", "memory"},
    # measuring a machine, and checking the simulator against it
    "calibrate": {"train", "planner"},
    "validate": {"calibrate"},
    # benchmarks a user runs: the peers and the emulated network's measured table
    "bench": {"validate"},
    # the only package that imports everything
    "cli": {"bench"},
    "__main__": {"cli"},
    "__init__": set(),
}

PURE = {
    "errors",
    "deadline",
    "gcpause",
    "yaml_io",
    "ranks",
    "schema",
    "models",
    "platforms",
    "config",
    "sizes",
    "schedule",
    "memory",
    "cost",
    "sim",
    "planner",
}


def allowed(table: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each package's transitive closure under `table` (itself excluded)."""
    out: dict[str, set[str]] = {}

    def walk(p: str, seen: tuple[str, ...]) -> set[str]:
        if p in seen:
            raise ValueError(f"the layer table has a loop: {' -> '.join((*seen, p))}")
        if p not in out:
            acc: set[str] = set()
            for d in table[p]:
                acc |= {d} | walk(d, (*seen, p))
            out[p] = acc
        return out[p]

    for p in table:
        walk(p, ())
    return out


def _package_of(path: Path, src: Path) -> str:
    rel = path.relative_to(src)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imports_of(path: Path, src: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    rel = path.relative_to(src.parent).with_suffix("")
    here = list(rel.parts[:-1])
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            if mod == "ratrain":  # `from ratrain import deadline`
                out += [(node.lineno, f"ratrain.{a.name}") for a in node.names]
    return out


def violations(src: Path, table: dict[str, set[str]], pure: set[str]) -> list[str]:
    ok = allowed(table)
    bad = []
    for path in sorted(src.rglob("*.py")):
        pkg = _package_of(path, src)
        if pkg not in table:
            bad.append(f"{path.relative_to(src)}: package {pkg!r} is not in the layer table")
            continue
        for line, mod in imports_of(path, src):
            parts = mod.split(".")
            where = f"{path.relative_to(src)}:{line}"
            if parts[0] == "torch" and pkg in pure:
                bad.append(f"{where}: pure layer {pkg!r} imports {mod}")
            if parts[0] != "ratrain" or len(parts) < 2:
                continue
            if parts[1] != pkg and parts[1] not in ok[pkg]:
                bad.append(f"{where}: {pkg!r} may not import {mod} (not below it)")
    return bad


def test_every_package_keeps_to_its_layer():
    bad = violations(SRC, DEPENDS, PURE)
    assert not bad, "\n".join(bad)


PARSES_ARGV = {"cli"}
"""The only package that reads command lines with argparse; everything below it takes its
arguments from its caller (a torchrun entry point is a `ratrain` subcommand)."""


def argparse_below_cli(src: Path, allowed_pkgs: set[str] = PARSES_ARGV) -> list[str]:
    """Every import of argparse (inside functions too) outside `allowed_pkgs`."""
    bad = []
    for path in sorted(src.rglob("*.py")):
        if _package_of(path, src) in allowed_pkgs:
            continue
        for line, mod in imports_of(path, src):
            if mod.split(".")[0] == "argparse":
                bad.append(f"{path.relative_to(src)}:{line}: imports {mod} below cli/")
    return bad


def test_no_argparse_below_cli():
    bad = argparse_below_cli(SRC)
    assert not bad, "\n".join(bad)


def test_layer_table_is_acyclic_and_complete():
    allowed(DEPENDS)  # raises on a loop
    on_disk = {_package_of(p, SRC) for p in SRC.rglob("*.py")}
    assert on_disk == set(DEPENDS), on_disk ^ set(DEPENDS)
    assert all(d in DEPENDS for deps in DEPENDS.values() for d in deps)


def test_a_loop_in_the_table_is_refused():
    with pytest.raises(ValueError, match="loop"):
        allowed({**DEPENDS, "schedule": {"memory"}})


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    src = tmp_path / "ratrain"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return src


@pytest.mark.parametrize(
    "text",
    [
        "from ratrain.planner import search\n",  # upward, at module level
        "def f():\n    from ratrain.runtime.stage import StageModel\n",  # upward, lazily
        "from ratrain import planner\n",
        "from ..planner import search\n",
    ],
)
def test_an_upward_import_is_caught(tmp_path, text):
    src = _tree(tmp_path, {"schedule/__init__.py": "", "schedule/ir.py": text})
    table = {"schedule": set(), "planner": {"schedule"}, "runtime": {"planner"}}
    bad = violations(src, table, set())
    assert len(bad) == 1 and "'schedule' may not import" in bad[0], bad


def test_torch_in_a_pure_layer_is_caught(tmp_path):
    src = _tree(tmp_path, {"sim/x.py": "def f():\n    import torch\n"})
    bad = violations(src, {"sim": set()}, {"sim"})
    assert bad == ["sim/x.py:2: pure layer 'sim' imports torch"], bad


def test_a_package_missing_from_the_table_is_caught(tmp_path):
    src = _tree(tmp_path, {"newpkg/a.py": "x = 1\n"})
    assert violations(src, {}, set()) == ["newpkg/a.py: package 'newpkg' is not in the layer table"]


def test_argparse_below_cli_is_caught(tmp_path):
    src = _tree(
        tmp_path,
        {
            "cli/run.py": "import argparse\n",
            "bench/probe.py": "def main():\n    import argparse\n",
            "train/request.py": "from argparse import Namespace\n",
        },
    )
    assert argparse_below_cli(src) == [
        "bench/probe.py:2: imports argparse below cli/",
        "train/request.py:1: imports argparse below cli/",
    ]
