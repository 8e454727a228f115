"""argparse `type=` converters the subcommands share: comma-separated lists."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T", int, float)


def _numbers(text: str, convert: Callable[[str], T]) -> list[T]:
    try:
        return [convert(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def floats(text: str) -> list[float]:
    """'0.1,0.5,0.9' -> [0.1, 0.5, 0.9]; argparse's one-line error otherwise."""
    return _numbers(text, float)


def ints(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; argparse's one-line error otherwise."""
    return _numbers(text, int)


def names(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']."""
    return [x.strip() for x in text.split(",") if x.strip()]
