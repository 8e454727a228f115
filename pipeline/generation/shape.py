"""The decoder graph's shape, all the runner (pipeline/generation/runner.py) and the
in-place decoder (pipeline/generation/slot_decoder.py) need to know of it; its own module
so that neither imports the other for it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DecoderShape:
    """What the runner needs to know of the graph (models/decoder/spec.json "architecture")."""

    layers: int
    heads: int
    head_dim: int
    context: int

    @classmethod
    def from_spec(cls, arch: Mapping[str, int]) -> DecoderShape:
        return cls(int(arch["layers"]), int(arch["heads"]), int(arch["head_dim"]), int(arch["context"]))
