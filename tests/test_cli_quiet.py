"""The command silences third-party warnings a user cannot act on; the library never does."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings

import pytest


def test_importing_the_library_installs_no_filter() -> None:
    code = (
        "import warnings, logging; n = len(warnings.filters); import verl_gdro, verl_gdro.cli, verl_gdro.step; "
        "assert len(warnings.filters) == n, 'import changed the warning filters'; "
        "assert not logging.getLogger('verl.plugin.platform.platform_manager').filters"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("engine", ["torchtitan", "veomni", "automodel", "mindspeed", "megatron"])
def test_the_command_silences_verls_missing_engine_warnings(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from verl_gdro import cli

    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cli.quiet_third_party_warnings()
        warnings.warn(f"{engine} engine is not available: ImportError('x')", UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["something else"]
    assert f"ignore:{engine} engine is not available:UserWarning" in __import__("os").environ["PYTHONWARNINGS"]


def test_the_command_silences_verls_cpu_platform_lines(caplog: pytest.LogCaptureFixture) -> None:
    from verl_gdro import cli

    cli.quiet_third_party_warnings()
    log = logging.getLogger("verl.plugin.platform.platform_manager")
    with caplog.at_level(logging.WARNING, logger=log.name):
        log.warning("No supported accelerator detected. Registered: %s. Falling back to 'nvidia'.", ("nvidia",))
        log.warning("a real problem")
    assert [r.getMessage() for r in caplog.records] == ["a real problem"]
