"""Bad input versus crashes: what the ``verl-gdro`` command answers with one line and exit 2.

The configuration checks (``verl_gdro.step.config``, the demo's ``DemoConfig``) raise
``ValueError`` naming the offending key and its allowed range. Inside a subcommand the same type
also comes out of real bugs, so the CLI cannot treat every ValueError as the user's mistake. A
subcommand therefore marks the part of its work that only reads and validates input with
:func:`usage_errors`; a ValueError raised there becomes a :class:`UsageError`, which
``verl_gdro.cli.main`` prints as ``verl-gdro <cmd>: error: <message>`` on stderr with exit status
2 (argparse's convention). Anything raised later (training, drawing, scoring) keeps its traceback.

Standard library only.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["UsageError", "positive_int", "usage_errors"]


class UsageError(ValueError):
    """Bad input from the command line or a config file; the message names the flag or key."""


@contextmanager
def usage_errors(*types: type[BaseException]) -> Iterator[None]:
    """Turn ``ValueError`` (and ``types``) raised inside the block into :class:`UsageError`.

    Wrap only input parsing and validation, never the work itself.
    """
    try:
        yield
    except UsageError:
        raise
    except (ValueError, *types) as e:
        raise UsageError(" ".join(str(e).split()) or type(e).__name__) from e


def positive_int(text: str) -> int:
    """argparse ``type=`` for counts that must be >= 1 (argparse then exits 2 naming the flag)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is invalid: must be an integer >= 1")
    return value
