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




def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"verl-gdro {version('verl-gdro')}"


@pytest.mark.parametrize("command", [None, *cli.SUBCOMMANDS])
def test_help_has_no_rest_markup(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    """--help is read in a terminal: no ``literal`` or :func:`role` markup from the docstrings."""
    with pytest.raises(SystemExit):
        cli.main([*([command] if command else []), "--help"])
    out = capsys.readouterr().out
    assert "``" not in out and ":func:" not in out and ":class:" not in out, out


def test_quick_demo_says_how_many_methods_it_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from verl_gdro.demo.config import QUICK_METHODS

    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"{len(QUICK_METHODS)} methods ({', '.join(QUICK_METHODS)}" in out


@pytest.mark.slow
def test_dry_run_errors_follow_the_cli_convention(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/cli.md: ``verl-gdro dry-run`` answers a bad config with one ``verl-gdro dry-run: error:``
    line and exit 2, like every subcommand (the recipes' ``python -m verl_gdro.dryrun`` keeps its
    ``DRY RUN FAILED:`` line); Hydra's multi-line answers become one line."""
    package = ["dry-run", "--config-path=pkg://verl_gdro.config", "--config-name=gdro_trainer"]
    assert cli.main([*package, "gdro.prompt.eta=-1"]) == 2
    err = capsys.readouterr().err
    assert err == "verl-gdro dry-run: error: gdro.prompt.eta=-1 is invalid: must be a finite number > 0.0\n", err
    assert cli.main([*package, "trainer.no_such_key=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("verl-gdro dry-run: error: Hydra composition failed:"), err
