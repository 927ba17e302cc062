"""The docs restate the code only where this test (or scripts/gen_docs.py) holds them to it.

- the generated blocks (config keys and defaults, presets, the mode line, the CLI flags) are what
  ``python scripts/gen_docs.py`` writes today;
- the key table of docs/configuration.md lists exactly the gdro keys of the package YAML, with its
  defaults, and the preset tables say what ``PRESETS`` sets;
- every ``verl-gdro <cmd> --flag`` written anywhere in the README or docs is a flag of that
  subcommand's parser;
- no file cites a contract outside the repository (docs/algorithm.md is the contract).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from verl_gdro.presets import DEFAULT_PRESET, PRESETS

ROOT = Path(__file__).resolve().parents[1]


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _block(path: str, name: str) -> str:
    text = (ROOT / path).read_text(encoding="utf-8")
    m = re.search(rf"<!-- generated:{name} -->\n(.*?)<!-- /generated:{name} -->", text, re.DOTALL)
    assert m, f"{path} lost its generated:{name} block"
    return m.group(1)


def _table_rows(block: str) -> list[list[str]]:
    rows = []
    for line in block.splitlines():
        if line.startswith("| `"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def test_generated_docs_are_current() -> None:
    stale = _gen_docs().regenerate(check=True)
    assert not stale, f"stale generated docs {stale}: run `python scripts/gen_docs.py` and commit the result"


def _yaml_leaves() -> dict[str, object]:
    group = yaml.safe_load((ROOT / "verl_gdro/config/gdro_trainer.yaml").read_text(encoding="utf-8"))["gdro"]
    out: dict[str, object] = {}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                out[f"gdro.{prefix}{key}"] = value

    walk(group, "")
    return out


def test_configuration_table_matches_the_package_yaml() -> None:
    rows = _table_rows(_block("docs/configuration.md", "config-keys"))
    documented = {r[0].strip("`"): r[1] for r in rows}
    leaves = _yaml_leaves()
    assert list(documented) == list(leaves), "docs/configuration.md keys differ from gdro_trainer.yaml"
    for key, default in leaves.items():
        shown = documented[key]
        literal = "null" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
        assert shown.startswith(f"`{literal}`"), f"{key}: documented default {shown!r}, YAML has {literal!r}"


@pytest.mark.parametrize("path", ["docs/configuration.md"])  # the README links to this table
def test_preset_tables_match_presets(path: str) -> None:
    block = _block(path, "presets")
    header = block.splitlines()[0]
    names = re.findall(r"`(\w+)`", header)
    assert names == list(PRESETS), f"{path}: preset columns {names} vs PRESETS {list(PRESETS)}"
    assert f"`{DEFAULT_PRESET}` (default)" in header
    for row in _table_rows(block):
        section, key = row[0].strip("`").removeprefix("gdro.").split(".")
        for preset, cell in zip(names, row[1:], strict=True):
            value = PRESETS[preset].get(section, {}).get(key, "(package default)")
            literal = "(package default)" if value == "(package default)" else (
                "`null`" if value is None else f"`{value}`")
            assert cell == literal, f"{path}: gdro.{section}.{key} under {preset}: {cell} vs {literal}"
    keys = {f"{s}.{k}" for p in PRESETS.values() for s, ks in p.items() for k in ks}
    assert {r[0].strip("`").removeprefix("gdro.") for r in _table_rows(block)} == keys


def _docs_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_cli_flags_in_the_docs_exist() -> None:
    import argparse

    from verl_gdro.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = {name: {s for a in p._actions for s in a.option_strings} for name, p in sub.choices.items()}
    bad = []
    for path in _docs_files():
        for line in path.read_text(encoding="utf-8").splitlines():
            for m in re.finditer(r"verl-gdro ([a-z-]+)((?: [^`|]*)?)", line):
                cmd, rest = m.group(1), m.group(2)
                if cmd not in flags:
                    continue
                for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
                    if flag not in flags[cmd]:
                        bad.append(f"{path.relative_to(ROOT)}: verl-gdro {cmd} {flag}")
            # make's DEMO_ARGS reach `verl-gdro demo`
            for args in re.findall(r"DEMO_ARGS=\"?([^\"`]*)", line):
                for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", args):
                    if flag not in flags["demo"]:
                        bad.append(f"{path.relative_to(ROOT)}: DEMO_ARGS {flag}")
    assert not bad, f"flags the parsers do not have: {bad}"


#: Files of issue 28's work in progress that still cite the old external contract; remove each
#: from this list when its citations point at docs/algorithm.md.
_CONTRACT_CITATIONS_PENDING: set[str] = set()


def test_no_file_cites_a_contract_outside_the_repository() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    citing = []
    for rel in tracked.splitlines():
        path = ROOT / rel
        if rel == "tests/test_docs_drift.py" or rel in _CONTRACT_CITATIONS_PENDING or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if any(name + ".md" in text for name in ("ALGORITHM", "VERL", "VERL_CPU")):
            citing.append(rel)
    assert not citing, f"cite docs/algorithm.md (the contract in this repository) instead: {citing}"
