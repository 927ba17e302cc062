"""The ``verl-gdro`` command: ``demo``, ``study``, ``decide``, ``plot``, ``simulate``, ``eval`` and ``dry-run``.

Each subcommand's module exposes ``add_arguments(parser)`` and ``main(args) -> int``, imported lazily
(``plot`` does not pay for torch). A :class:`verl_gdro.errors.UsageError` is one line and exit status 2
(docs/development.md, "CLI input errors"); any other exception keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
import warnings

from verl_gdro.demo.config import QUICK_METHODS  # standard library only
from verl_gdro.errors import UsageError

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "verl_gdro.demo.run",
        "CPU demo: GRPO vs Prompt-GDRO, Rollout-GDRO and joint (the default) on a tiny model; --quick runs "
        f"{len(QUICK_METHODS)} methods ({', '.join(QUICK_METHODS)})",
    ),
    "study": ("verl_gdro.demo.study", "paired multi-seed study: GDRO vs GRPO at equal rollouts, with intervals"),
    "decide": ("verl_gdro.demo.decide", "apply the stated rule that picks the robust default from study results"),
    "plot": ("verl_gdro.plots", "redraw the curriculum figures from metrics.jsonl or verl's file-logger JSONL"),
    "simulate": ("verl_gdro.simulate", "controller-only simulation printing bins, weights and allocations"),
    "eval": ("verl_gdro.eval.cli", "mean@k / pass@k tables from validation generations"),
    "dry-run": ("verl_gdro.dryrun", "compose and validate a main_ppo command line without Ray or a model"),
}


#: verl's warnings at import for every optional training engine not installed (none is needed here);
#: silenced by the command only, never at import of the library.
QUIET_WARNINGS: tuple[str, ...] = tuple(
    f"{engine} engine is not available" for engine in ("torchtitan", "veomni", "automodel", "mindspeed", "megatron")
)


#: verl's platform manager logs these on every CPU-only machine; the CPU path needs no accelerator.
QUIET_LOG_PREFIXES: tuple[str, ...] = ("No supported accelerator detected", "Platform '")


def _quiet_cpu_platform(record: logging.LogRecord) -> bool:
    return not (record.levelno == logging.WARNING and str(record.msg).startswith(QUIET_LOG_PREFIXES))


def quiet_third_party_warnings() -> None:
    """Ignore :data:`QUIET_WARNINGS` in this process and in the worker processes it starts, and
    verl's CPU-platform log lines (:data:`QUIET_LOG_PREFIXES`) in this process."""
    platform_logger = logging.getLogger("verl.plugin.platform.platform_manager")
    if _quiet_cpu_platform not in platform_logger.filters:
        platform_logger.addFilter(_quiet_cpu_platform)
    for message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    # worker processes (study --jobs) inherit the environment, not the filters
    extra = ",".join(f"ignore:{m}:UserWarning" for m in QUIET_WARNINGS)
    current = os.environ.get("PYTHONWARNINGS", "")
    if extra not in current:
        os.environ["PYTHONWARNINGS"] = f"{current},{extra}" if current else extra


def plain_help(text: str | None) -> str | None:
    """Help text for a terminal: the docstrings' reST literals (````x````, ``:func:`x```) as plain ``x``."""
    return re.sub(r":\w+:`~?([^`]+)`", r"\1", text).replace("``", "") if text else text


def _plain_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = plain_help(parser.description)
    for action in parser._actions:
        action.help = plain_help(action.help)
        for choice in getattr(action, "_choices_actions", []):
            choice.help = plain_help(choice.help)
        for sub in (getattr(action, "choices", None) or {}).values() if isinstance(action, argparse._SubParsersAction) else []:
            _plain_parser(sub)


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    try:
        package_version = version("verl-gdro")  # pyproject.toml's
    except PackageNotFoundError:  # a bare checkout
        package_version = "unknown"
    parser = argparse.ArgumentParser(prog="verl-gdro", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"verl-gdro {package_version}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        try:
            mod = importlib.import_module(module)
        except ImportError:  # keep the rest usable; main() imports it again and raises the real error
            continue
        mod.add_arguments(p)
    _plain_parser(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    quiet_third_party_warnings()
    args = build_parser().parse_args(argv)
    mod = importlib.import_module(args._module)  # a missing part raises its real error here
    try:
        return int(mod.main(args) or 0)
    except UsageError as e:
        print(f"verl-gdro {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
