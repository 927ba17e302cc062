"""``verl-gdro``: bad input gets one line naming the flag or key and exit 2; crashes keep tracebacks (issue 13)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from verl_gdro import cli
from verl_gdro.errors import UsageError, usage_errors


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["demo", "--gdro", "prompt.eta=-1"], "gdro.prompt.eta=-1 is invalid: must be a finite number > 0.0"),
        (["demo", "--gdro", "prompt.nope=1"], "gdro.prompt.nope is not a known key"),
        (["demo", "--gdro", "prompt.eta=[1"], "verl-gdro demo: error:"),  # not YAML
        (["demo", "--methods", "bogus"], "unknown method 'bogus'"),
        (["demo", "--steps", "0"], "steps=0 must be >= 1"),
        (["demo", "--set", "lr=abc"], "--set lr='abc': expected a float"),
        (["plot", "/no/such/run"], "RUN_OR_JSONL='/no/such/run': no such file"),
        (["eval", "--run", "a=/no/such/dump"], "verl-gdro eval: error:"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"verl-gdro {argv[0]}: error: "), err
    assert needle in err and "Traceback" not in err


def test_argparse_bad_flags_also_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["simulate", "--steps", "0"])
    assert e.value.code == 2
    assert "argument --steps: 0 is invalid: must be an integer >= 1" in capsys.readouterr().err


def test_a_real_crash_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ValueError outside the input-validation block is a bug, not the user's mistake."""
    import verl_gdro.simulate as sim

    def broken(args: object) -> int:
        raise ValueError("internal invariant violated")

    monkeypatch.setattr(sim, "main", broken)
    with pytest.raises(ValueError, match="internal invariant"):
        cli.main(["simulate", "--steps", "1"])


def test_usage_errors_wraps_only_the_listed_types() -> None:
    with pytest.raises(UsageError, match="^a b$"), usage_errors():
        raise ValueError("a\n  b")
    with pytest.raises(KeyError), usage_errors():
        raise KeyError("not input")
    with pytest.raises(UsageError), usage_errors(FileNotFoundError):
        raise FileNotFoundError("x")


@pytest.mark.slow
def test_console_entry_point_exit_status() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from verl_gdro.cli import main; sys.exit(main())", "demo", "--gdro",
         "prompt.eta=-1"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "verl-gdro demo: error: gdro.prompt.eta=-1 is invalid: must be a finite number > 0.0"
    ]


