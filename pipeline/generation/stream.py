"""One request's generation as it grows: its sampler, its text, its stop strings and its
chunks. Pure (numpy for sampling; the clock is passed in), so the runner
(pipeline/generation/runner.py) and the Kafka loop (pipeline/generation/service.py)
share it and unit tests drive it with a fake clock.

The decoder is byte level (models/decoder/tokenizer.py): a token is a byte, 256 is end
of text. Chunks therefore end at a UTF-8 character boundary, and they hold back the
bytes that could still turn out to be the start of a stop string, so no chunk ever
carries text that the final record does not (the final text leaves the stop string
out, as OpenAI's API does).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from models.decoder.tokenizer import EOS


def request_seed(request_id: str, seed: int | None = None) -> int:
    """The sampling seed of a request: its own `seed`, else one from its id, so a request
    generated again after a restart samples the same tokens (pipeline/generation/service.py)."""
    if seed is not None:
        return seed
    return int.from_bytes(hashlib.sha256(request_id.encode("utf-8")).digest()[:8], "big")


def sample(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """Greedy (temperature 0) or a draw from softmax(logits / temperature)."""
    if temperature <= 0.0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    return int(rng.choice(p.size, p=p / p.sum()))


def _utf8_boundary(data: bytes, end: int) -> int:
    """The largest cut <= end that does not split a UTF-8 character of data."""
    cut = end
    # back over continuation bytes (10xxxxxx) to the lead byte, at most 3
    while cut > 0 and end - cut < 3 and (data[cut - 1] & 0xC0) == 0x80:
        cut -= 1
    if cut > 0 and data[cut - 1] >= 0xC0:  # a lead byte: is its character whole?
        lead = data[cut - 1]
        need = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        if end - (cut - 1) < need:
            return cut - 1
        return end
    return end


@dataclass(frozen=True, slots=True)
class Chunk:
    seq: int  # 0, 1, ... within one attempt
    offset: int  # byte offset of `text` in the final text
    text: str
    tokens: int  # tokens generated up to the end of this chunk


@dataclass(slots=True, eq=False)
class Generation:
    """What the runner and the loop need of one request beyond the scheduler's view
    (pipeline/generation/sequence.py keeps this in GenRequest.item)."""

    request_id: str
    prompt: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    stop: tuple[bytes, ...] = ()
    seed: int | None = None
    tokens: list[int] = field(default_factory=list)
    stop_hit: bytes | None = None  # the stop string that ended it
    rng: np.random.Generator = field(init=False)
    _out: bytearray = field(default_factory=bytearray)
    _sent: int = 0  # bytes of _out already in chunks
    _chunks: int = 0
    _pending_since: float | None = None

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(request_seed(self.request_id, self.seed))

    @property
    def last_token(self) -> int:
        return self.tokens[-1] if self.tokens else self.prompt[-1]

    def push(self, token: int) -> bool:
        """Take the next token; True when it ends the generation (EOS or a stop string)."""
        self.tokens.append(token)
        if token >= EOS:
            return True
        self._out.append(token)
        for s in self.stop:
            if self._out.endswith(s):
                self.stop_hit = s
                return True
        return False

    @property
    def text_bytes(self) -> bytes:
        """The final text's bytes: without a stop string that ended it."""
        end = len(self._out) - (len(self.stop_hit) if self.stop_hit else 0)
        return bytes(self._out[:end])

    @property
    def text(self) -> str:
        return self.text_bytes.decode("utf-8", errors="replace")

    # -- chunks ---------------------------------------------------------------------
    def _safe_end(self) -> int:
        """Bytes that may go out while running: none that may start a stop string,
        none of a half-written character."""
        hold = max((len(s) for s in self.stop), default=1) - 1
        return _utf8_boundary(bytes(self._out), max(len(self._out) - hold, self._sent))

    def chunk(self, now: float, chunk_tokens: int, flush_s: float) -> Chunk | None:
        """The next chunk of a running generation when one is due: `chunk_tokens` bytes
        ready, or the oldest unsent one waiting `flush_s`."""
        end = self._safe_end()
        ready = end - self._sent
        if ready <= 0:
            return None
        if self._pending_since is None:
            self._pending_since = now
        if ready >= chunk_tokens or now - self._pending_since >= flush_s:
            return self._take(end)
        return None

    def last_chunk(self) -> Chunk | None:
        """What is left of the final text once the generation ended (None: nothing)."""
        end = len(self.text_bytes)
        return self._take(end) if end > self._sent else None

    def _take(self, end: int) -> Chunk:
        data = bytes(self._out[self._sent:end])
        out = Chunk(self._chunks, self._sent, data.decode("utf-8", errors="replace"), len(self.tokens))
        self._chunks += 1
        self._sent = end
        self._pending_since = None
        return out

    @property
    def chunks_sent(self) -> int:
        return self._chunks


def stop_bytes(stops: Sequence[str]) -> tuple[bytes, ...]:
    return tuple(s.encode("utf-8") for s in stops if s)
