"""Every row of docs/configuration.md's catalogue of invalid overrides, run as the user would run it
(issue 36, item 14): the documented override on the package config, through the dry run (Hydra's
compose, then the checks main_ppo's driver runs), gives the documented message, as one line."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from verl_gdro.dryrun import dry_run

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
PACKAGE = ["--config-path=pkg://verl_gdro.config", "--config-name=gdro_trainer"]


def catalogue() -> list[tuple[str, str, str, str]]:
    """(check, override, key, message) of every row of the catalogue."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Catalogue of config checks", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        m = re.match(r"^\| (.+?) \| `(.+?)` \| `(.+?)` \| `(.+)` \|$", line)
        if m:
            rows.append(m.groups())
    return rows


ROWS = catalogue()


def test_the_catalogue_is_parsed_whole() -> None:
    text = DOC.read_text(encoding="utf-8").split("## Catalogue of config checks", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(ROWS) == len(lines) - 1 and len(ROWS) > 70  # every row but the header


@pytest.mark.slow
@pytest.mark.parametrize(("check", "override", "key", "message"), ROWS, ids=[r[0] for r in ROWS])
def test_every_catalogue_row_gives_its_message(check: str, override: str, key: str, message: str, capsys) -> None:
    assert dry_run(PACKAGE + shlex.split(override), print_config=False) == 2
    err = capsys.readouterr().err
    assert err == f"DRY RUN FAILED: {message}\n", err
    assert message.startswith(key), (key, message)
