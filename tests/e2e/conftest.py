"""Fixtures every e2e test module shares: where its runs write, and the tiny model, tokenizer and
data they train on (built once per module). Outside ``.venv-e2e`` the tier skips, or fails under
``E2E_REQUIRED=1`` (``tests/e2e/run.sh`` sets it: there a missing environment is a failure)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest


def in_e2e_env() -> bool:
    """Whether this interpreter has vLLM and verl (the pinned ``.venv-e2e``)."""
    return importlib.util.find_spec("vllm") is not None and importlib.util.find_spec("verl") is not None


@pytest.fixture(scope="module")
def e2e_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not in_e2e_env():
        msg = "the e2e tier runs in .venv-e2e: use `make test-e2e` (tests/e2e/run.sh)"
        if os.environ.get("E2E_REQUIRED") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    root = os.environ.get("E2E_WORK_DIR")
    return Path(root).resolve() if root else tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def assets(e2e_root: Path) -> dict[str, str]:
    from e2e_assets import build_all

    return build_all(e2e_root / "assets")
