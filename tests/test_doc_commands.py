"""Every command line the docs give runs (issue 32): README.md and docs/*.md.

Collected: each ``bash recipes/...``, ``python -m verl.trainer.main_ppo ...``, ``verl-gdro ...``
and ``scripts/submit_sweep.py ...`` line of a fenced code block or of an inline code span, with
its leading ``VAR=value`` assignments and backslash continuations. Each is then run as far as a
CPU machine can without training:

- a recipe: through bash, with ``DRY_RUN=1`` (the recipe's own dry-run path: same arguments as
  its ``main_ppo`` launch), the dry run in this process;
- ``main_ppo``: the dry run on the same arguments (``verl_gdro.dryrun``);
- ``verl-gdro dry-run``: run; any other ``verl-gdro`` subcommand: its command line parsed by the
  CLI's own parser (they train, evaluate or draw from files: what they do is tested elsewhere);
- ``submit_sweep.py``: run with ``--dry-run``, and every distinct job it prints dry-run as the
  recipe it would start (with the job's environment and ``EXTRA_ARGS``).

Placeholders a reader fills in are substituted: data and output paths (``$DATA_DIR``,
``$OUTPUT_DIR``, ``data.*_files=...``), ``<repo>``, ``<recipe>`` / ``NAME`` (a recipe name), and a
bare ``...`` (the rest of a user's settings: the rollout engine and micro-batch sizes verl's own
checks need). ``docs/history.md`` is a record of past runs, not instructions, and is not collected.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md") if p.name != "history.md")]
TRIGGERS = ("bash recipes/", "verl.trainer.main_ppo", "verl-gdro ", "submit_sweep.py")
#: what a bare `...` stands for: the settings verl's own checks need that a doc line leaves to the user
REST = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
]


@dataclass(frozen=True)
class DocCommand:
    where: str
    text: str

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def _code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command) of every fenced code block line (continuations joined) and every
    inline code span."""
    out: list[tuple[int, str]] = []
    lines = text.splitlines()
    fenced = False
    pending, start = "", 0
    for i, line in enumerate(lines, start=1):
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            stripped = line.rstrip()
            if not pending:
                start = i
            if stripped.endswith("\\"):
                pending += stripped[:-1] + " "
                continue
            out.append((start, pending + stripped))
            pending = ""
        else:
            out += [(i, span) for span in re.findall(r"`([^`\n]+)`", line)]
    return out


def _is_command(text: str) -> bool:
    """A command line, not a mention: ``main_ppo`` with its ``--config-path``, ``submit_sweep.py``
    with options, ``verl-gdro`` followed by one of its subcommands and an argument, a recipe."""
    from verl_gdro.cli import SUBCOMMANDS

    words = text.split()
    if "verl.trainer.main_ppo" in text:
        return "--config-path" in text
    if "submit_sweep.py" in text:
        return any(w.startswith("--") for w in words)
    if "bash recipes/" in text:
        return True
    if "verl-gdro" in words:
        i = words.index("verl-gdro")
        return len(words) > i + 2 and words[i + 1] in SUBCOMMANDS
    return False


def collect() -> list[DocCommand]:
    found = []
    for path in DOCS:
        for line, text in _code_lines(path.read_text(encoding="utf-8")):
            text = re.sub(r"\s+#\s.*$", "", text).strip()  # a trailing shell comment
            if _is_command(text):
                found.append(DocCommand(f"{path.relative_to(REPO)}:{line}", text))
    return found


COMMANDS = collect()


def test_the_docs_give_commands_of_each_kind() -> None:
    kinds = {t: [c for c in COMMANDS if t in c.text] for t in TRIGGERS}
    assert all(kinds.values()), {t: len(v) for t, v in kinds.items()}


def _substitute(text: str, tmp: Path) -> list[str]:
    loop = re.match(r"^for (\w+) in (\S+)[^;]*; do (.*); done$", text)
    if loop:  # a shell loop over values: its body, with the first value
        name, first, body = loop.groups()
        text = body.replace(f"${name}", first)
    text = text.replace("<repo>", str(REPO)).replace("<recipe>", "joint_qwen3_8b").replace("recipes/NAME.sh",
                                                                                             "recipes/joint_qwen3_4b.sh")
    text = text.replace("$DATA_DIR", str(tmp / "data")).replace("$OUTPUT_DIR", str(tmp / "out"))
    words = []
    for w in shlex.split(text):
        if w == "...":
            words += REST
        elif w.endswith("=...") and w.startswith("data."):
            words.append(w[:-3] + str(tmp / "data" / "train.parquet"))
        elif w.endswith("=..."):
            words.append(w[:-3] + "placeholder")
        else:
            words.append(w)
    return words


def _env_prefix(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        k, v = words[0].split("=", 1)
        env[k] = v
        words = words[1:]
    return env, words


def _recipe_dry_run(tmp: Path, recipe: str, env: dict[str, str], args: list[str], capsys) -> tuple[int, str]:
    """The recipe through bash with DRY_RUN=1 and a stub interpreter that records its argv; the
    dry run on that argv in this process (one import of verl for all commands)."""
    from verl_gdro import dryrun

    out = tmp / "argv"
    stub = tmp / "stub_python"
    stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$ARGV_OUT"\n')
    stub.chmod(0o755)
    full = {**os.environ, "DATA_DIR": str(tmp / "data"), "OUTPUT_DIR": str(tmp / "out"), **env,
            "DRY_RUN": "1", "PYTHON": str(stub), "ARGV_OUT": str(out)}
    subprocess.run(["bash", str(REPO / recipe), *args], check=True, env=full, cwd=REPO)
    argv = out.read_text().splitlines()
    assert argv[:2] == ["-m", "verl_gdro.dryrun"], argv
    status = dryrun.main(["--quiet", *argv[2:]])
    return status, capsys.readouterr().err


def _run(cmd: DocCommand, tmp: Path, capsys) -> None:
    words = _substitute(cmd.text, tmp)
    env, words = _env_prefix(words)
    if words[:1] == ["bash"] and words[1].startswith("recipes/"):
        status, err = _recipe_dry_run(tmp, words[1], env, words[2:], capsys)
        assert status == 0, f"{cmd}\n{err}"
    elif "verl.trainer.main_ppo" in words:
        from verl_gdro import dryrun

        args = words[words.index("verl.trainer.main_ppo") + 1:]
        assert dryrun.main(["--quiet", *args]) == 0, f"{cmd}\n{capsys.readouterr().err}"
    elif "verl-gdro" in words:
        from verl_gdro import cli

        args = words[words.index("verl-gdro") + 1:]
        if args[0] != "dry-run":
            args = [w for w in args if w not in REST]  # `...` adds nothing to other subcommands
        if args[0] == "dry-run":
            assert cli.main(args) == 0, f"{cmd}\n{capsys.readouterr().err}"
        else:
            try:
                cli.build_parser().parse_args(args)
            except SystemExit as e:
                pytest.fail(f"{cmd}: the CLI refuses this command line ({e}): {capsys.readouterr().err}")
    elif any(w.endswith("submit_sweep.py") for w in words):
        _sweep(cmd, words, tmp, capsys)
    else:
        pytest.fail(f"{cmd}: no runner for this command")


def _sweep(cmd: DocCommand, words: list[str], tmp: Path, capsys) -> None:
    from test_recipes_slurm import sweep

    args = words[next(i for i, w in enumerate(words) if w.endswith("submit_sweep.py")) + 1:]
    if "--dry-run" not in args:
        args.append("--dry-run")
    # the jobs are dry-run below, in this process (the sweep's own validation does the same in a
    # process of its own: tests/test_recipes_slurm.py)
    assert sweep.main([*args, "--no-validate", "--log-dir", str(tmp / "logs")]) == 0, str(cmd)
    jobs = capsys.readouterr().out.strip().splitlines()
    assert jobs, f"{cmd}: no job listed"
    seen = set()
    for line in jobs:
        env, rest = _env_prefix(shlex.split(line))
        key = (env["RECIPE"], env.get("PRESET"), env.get("TEMPLATE"), env.get("EXTRA_ARGS", ""))
        if key in seen:
            continue
        seen.add(key)
        extra = env.pop("EXTRA_ARGS", "").split()
        nodes = next(int(a.split("=")[1]) for a in rest if a.startswith("--nodes="))
        status, err = _recipe_dry_run(tmp, f"recipes/{env['RECIPE']}.sh", {**env, "NNODES": str(nodes)}, extra, capsys)
        assert status == 0, f"{cmd} -> {line}\n{err}"


@pytest.mark.slow
@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.where for c in COMMANDS])
def test_every_documented_command_runs(cmd: DocCommand, tmp_path: Path, capsys) -> None:
    _run(cmd, tmp_path, capsys)


def test_one_gpu_install_line_with_the_extras_that_bring_vllm_fsdp_and_the_math_scorer() -> None:
    """The GPU extra of pyproject.toml brings verl 0.9.1 with vLLM and FSDP and math-verify; every
    doc that tells a GPU user what to install quotes that one line, and no doc another one."""
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    gpu = extras["gpu"]
    verl = next(r for r in gpu if r.startswith("verl["))
    assert set(verl[len("verl["):verl.index("]")].split(",")) >= {"vllm", "fsdp"} and verl.endswith("==0.9.1")
    assert any(r.startswith("math-verify") for r in gpu)
    line = 'pip install -e ".[gpu]"'
    for name in ("README.md", "docs/reproduce.md"):
        assert line in (REPO / name).read_text(), name
    for path in DOCS:
        text = path.read_text()
        assert 'pip install "verl[' not in text and '.[verl]"' not in text, f"{path.name} quotes another GPU install"
