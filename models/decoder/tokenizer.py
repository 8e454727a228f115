"""The decoder's tokenizer: UTF-8 bytes. Token b (0..255) is the byte b, and token 256
is end of text, which the training text has after each document
(models/decoder/build.py), so the model learns to emit it. No vocabulary file: any text
encodes, and any token sequence decodes (a split multi-byte character as U+FFFD)."""

from __future__ import annotations

from collections.abc import Iterable

EOS = 256
VOCAB = 257


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(tokens: Iterable[int]) -> str:
    """The bytes of the tokens below EOS as UTF-8 text; EOS and above are dropped."""
    return bytes(t for t in tokens if 0 <= t < EOS).decode("utf-8", errors="replace")
