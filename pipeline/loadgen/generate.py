"""Generate requests for `tidebatch generate` (docs/GENERATION.md), as
`tidebatch produce generate` sends them: a chat backend's load.

- prompt: a chat line of many users (pipeline/loadgen/data/chat_lines_en.txt, from
  chatterbot-corpus under BSD-3-Clause, attribution in its header; the text load
  generator's short lines, pipeline/loadgen/text.py), cut to `max_prompt_bytes`;
- max_new_tokens: drawn from `output` (pipeline/simulate/rows.py's RowsDist; default
  log-uniform over 8..200: as many 8-16 as 100-200, chat answers' skew, the lengths of
  issue 25's workload and of bench/generation.py), at most the decoder's context
  minus the prompt, so no request is refused for its length;
- request_id `gen-<seed>-<i>`, also the record's key (a request's chunks and final
  record land on one partition, keyed by it: pipeline/generation/records.py).

Every request is a pure function of (seed, i), as pipeline/loadgen/text.py's are.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import orjson

from pipeline.loadgen.text import chat_lines
from pipeline.simulate.rows import RowsDist

INPUT_TOPIC = "generate.requests"  # pipeline/app/generation.py's default
DEFAULT_OUTPUT = "loguniform:8:200"
CONTEXT = 256  # models/decoder/spec.json: prompt bytes + max_new_tokens fit in it
MAX_PROMPT_BYTES = 48

Sample = tuple[bytes | None, bytes, list[tuple[str, bytes]]]


def generate_samples(seed: int = 1, output: str = DEFAULT_OUTPUT, *, deadline_ms: int | None = None,
                     max_prompt_bytes: int = MAX_PROMPT_BYTES, context: int = CONTEXT) -> Callable[[int], Sample]:
    """i -> (key, value, headers) of the i-th request. Raises UserError on a bad
    `output` distribution (RowsDist.parse)."""
    dist = RowsDist.parse(output)
    lines = chat_lines()

    def make(i: int) -> Sample:
        rng = random.Random(f"generate:{seed}:{i}")
        prompt = rng.choice(lines).encode("utf-8")[:max_prompt_bytes].decode("utf-8", "ignore") or "Hello"
        room = context - len(prompt.encode("utf-8"))
        rid = f"gen-{seed}-{i}"
        doc: dict[str, object] = {"request_id": rid, "prompt": prompt,
                                  "max_new_tokens": max(1, min(dist.sampler(rng)(), room))}
        if deadline_ms is not None:
            doc["deadline_ms"] = deadline_ms
        return rid.encode(), orjson.dumps(doc), []

    return make
