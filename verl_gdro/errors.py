"""Bad input versus crashes: what the ``verl-gdro`` command answers with one line and exit 2.

Real bugs raise ValueError too, so only the input handling a subcommand wraps in :func:`usage_errors`
becomes a :class:`UsageError` (docs/development.md, "CLI input errors"). Standard library only.
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
    """Turn ``ValueError`` (and ``types``) raised inside the block, input handling only, into :class:`UsageError`."""
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
