"""The package reads bottom-up: math -> step API -> verl glue -> tools, with no import circle.

The layout is the architecture (``docs/development.md``, ``verl_gdro/__init__.py``): a reader should be
able to trust that ``verl_gdro/step/`` is everything a training loop calls and that nothing there
or below reaches up into verl. These tests read every module's imports with :mod:`ast` (including
the lazy ones inside functions and the ``TYPE_CHECKING`` ones), so a new upward import or circle
fails here before it confuses anyone; a new module must be given a floor in :data:`FLOORS`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "verl_gdro"

MATH, STEP, GLUE, TOOLS = 1, 2, 3, 4
FLOOR_NAMES = {MATH: "math", STEP: "step API", GLUE: "verl glue", TOOLS: "tools"}

#: first name under verl_gdro -> floor. ``errors`` (exception types) and ``config`` (the package
#: YAML, read as a resource) have no imports of their own and serve every floor, so they sit at the
#: bottom with the math. The root package sits with the step API, which it re-exports.
FLOORS = {
    "classifier": MATH, "evidence": MATH, "prompt_gdro": MATH, "rollout_gdro": MATH, "metrics": MATH, "presets": MATH,
    "allocators": MATH, "signals": MATH, "prompt_modes": MATH,
    "errors": MATH, "config": MATH,
    "step": STEP, "__init__": STEP,
    "integration": GLUE,
    "demo": TOOLS, "eval": TOOLS, "dryrun": TOOLS, "cli": TOOLS, "plots": TOOLS, "simulate": TOOLS,
    "data": TOOLS,
}

#: modules that may import neither verl nor torch, even lazily (they are what a loop without verl runs)
VERL_FREE_FLOORS = (MATH, STEP)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "__init__"
    if key not in FLOORS:
        raise AssertionError(f"{module} has no floor: add verl_gdro.{key} to FLOORS in tests/test_layering.py")
    return FLOORS[key]


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PACKAGE_DIR / rel).with_suffix(".py").is_file() or (PACKAGE_DIR / rel / "__init__.py").is_file()


def _root_export(name: str) -> str:
    """The step-API module that ``from verl_gdro import name`` loads (the root's lazy table)."""
    import verl_gdro

    return verl_gdro._STEP_API[name]


def imports_of(path: Path) -> tuple[set[str], set[str]]:
    """(verl_gdro modules, other top-level packages) that ``path`` imports anywhere in its body."""
    ours: set[str] = set()
    others: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                (ours if alias.name.split(".")[0] == "verl_gdro" else others).add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "verl_gdro":
                others.add(node.module)
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if _is_module(sub):
                    ours.add(sub)
                elif node.module == "verl_gdro" and alias.name != "__version__":
                    ours.add(_root_export(alias.name))
                else:
                    ours.add(node.module)
    return ours, {name.split(".")[0] for name in others}


def import_graph() -> dict[str, tuple[set[str], set[str]]]:
    return {module_name(p): imports_of(p) for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def test_every_import_points_down_or_sideways() -> None:
    upward = []
    for module, (ours, _) in import_graph().items():
        for target in ours:
            if floor(target) > floor(module):
                upward.append(f"{module} ({FLOOR_NAMES[floor(module)]}) imports {target} ({FLOOR_NAMES[floor(target)]})")
    assert not upward, "\n".join(sorted(upward))


def test_math_and_step_api_never_import_verl_or_torch() -> None:
    heavy = {"verl", "torch", "ray", "transfer_queue", "tensordict", "torchdata"}
    found = [
        f"{module} imports {sorted(others & heavy)}"
        for module, (_, others) in import_graph().items()
        if floor(module) in VERL_FREE_FLOORS and others & heavy
    ]
    assert not found, found


def test_no_import_circle() -> None:
    """Lazy imports count too: ``integration/plugin`` <-> ``integration/trainer`` was one."""
    graph = {m: {t for t in ours if t != m} for m, (ours, _) in import_graph().items()}
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                pytest.fail("import circle: " + " -> ".join([*stack[stack.index(nxt):], nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_checker_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """The graph must include imports inside functions and under TYPE_CHECKING, or the circle the
    plugin and trainer had (a lazy import) would have passed unnoticed."""
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from verl_gdro.step.controller import GDROController\n"
        "def f():\n    from verl_gdro.integration import trainer\n    import torch\n"
        "from verl_gdro import resolve_gdro\n"
    )
    ours, others = imports_of(src)
    assert ours == {"verl_gdro.step.controller", "verl_gdro.integration.trainer", "verl_gdro.step.config"}
    assert "torch" in others


def test_step_api_from_the_package_root_imports_neither_verl_nor_torch() -> None:
    code = (
        "import sys\n"
        "import verl_gdro\n"
        "assert 'verl_gdro.step.controller' not in sys.modules  # the root itself loads nothing\n"
        "from verl_gdro import GDROController, gdro_step, resolve_gdro, validate_gdro_config, describe_mode\n"
        "from verl_gdro.step.controller import GDROController as C\n"
        "assert GDROController is C\n"
        "ctrl = GDROController.from_config({'rollout': {'enable': True}}, rollout_n=4)\n"
        "plan = ctrl.before_generation([1, 2, 3])\n"
        "assert int(plan.rollout_n.sum()) == 12\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('verl', 'torch', 'ray'))\n"
        "assert not bad, bad\n"
        "print('CLEAN')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CLEAN" in proc.stdout


def test_old_step_api_paths_are_gone() -> None:
    """No shims: the step API has one home, so docs and imports cannot drift between two."""
    for name in ("controller", "config", "context"):
        assert not (PACKAGE_DIR / "integration" / f"{name}.py").exists()
    import verl_gdro

    with pytest.raises(AttributeError):
        verl_gdro.not_a_step_api_name  # noqa: B018
