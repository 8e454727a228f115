"""Cases taking turns over rounds, so that the machine's drift and slow spells spread
over all of them (bench/delivery.py, bench/camera_text.py).
"""

from __future__ import annotations


def rotated(items: list, round_no: int) -> list:
    """The cases in the order of round `round_no`: each round starts one case later, so
    each case goes first once every len(items) rounds."""
    k = round_no % len(items) if items else 0
    return items[k:] + items[:k]
