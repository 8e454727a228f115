"""Text request generator for the text embedding model (pipeline/codecs/text.py).

Length mix (word pieces incl. [CLS]/[SEP], measured with the model's tokenizer on
20,000 requests of seed 1: min / median / max):
  70 %  short chat lines, 5 / 10 / 22 tokens: real lines from chatterbot-corpus
        (BSD-3-Clause, pipeline/loadgen/data/chat_lines_en.txt, attribution in its header)
  20 %  medium texts, 18 / 62 / 111 tokens: the start of a product review
  10 %  long reviews, 135 / 263 / 397 tokens: about half (52 %) exceed the model's 256
        and get truncated, i.e. ~5 % of all requests
No package with a clear permissive licence was found that ships real long reviews
(150-400 tokens), so medium and long texts come from the small review grammar below,
written for this project.

Every request is a pure function of (seed, i): make(i) can be called in any order,
from any process, and gives the same bytes.
"""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import orjson

CHAT_LINES_PATH = Path(__file__).resolve().parent / "data" / "chat_lines_en.txt"
SHORT_SHARE, MEDIUM_SHARE = 0.70, 0.20  # the rest is long
LONG_TOKENS = (150, 400)
TOKENS_PER_WORD = 1.2  # word pieces per whitespace word in the review grammar (measured)
TENANTS = ("acme", "globex", "initech", "umbrella")
INVALID_KINDS = ("empty_text", "overlong", "non_utf8", "missing_text", "mistyped_text")

_PRODUCTS = {
    "blender": ["jar", "motor", "lid", "blades", "base"],
    "pair of headphones": ["ear cushions", "battery", "noise cancelling", "microphone", "headband"],
    "coffee grinder": ["burrs", "hopper", "dial", "motor", "catch cup"],
    "pair of hiking boots": ["soles", "laces", "toe box", "lining", "heel"],
    "desk lamp": ["arm", "switch", "base", "dimmer", "shade"],
    "backpack": ["zippers", "straps", "laptop sleeve", "side pockets", "fabric"],
    "air fryer": ["basket", "timer", "display", "fan", "non-stick coating"],
    "office chair": ["armrests", "wheels", "lumbar support", "seat cushion", "gas lift"],
    "rice cooker": ["inner pot", "lid seal", "keep-warm setting", "steam vent", "timer"],
    "e-reader": ["screen", "battery", "page buttons", "front light", "case"],
}
_OPENERS = [
    "I bought this {p} {when} after my old one finally gave up.",
    "We have been using the {p} every day for {dur} now.",
    "This is my second {p} from this brand, and I had high hopes.",
    "I was torn between this {p} and a more expensive model, and went with this one.",
    "My partner picked this {p} out, so I was a little skeptical at first.",
    "Ordered the {p} as a gift, then ended up keeping it for myself.",
]
_PRAISE = [
    "The {a} is {good} and feels like it will last for years.",
    "Honestly the {a} surprised me, it is {good} for the price.",
    "I really like the {a}; it is {good} and easy to clean.",
    "Setup took about {mins} minutes and the {a} worked right out of the box.",
    "Compared to my old one, the {a} is far more {good2}.",
    "The {a} is quiet, solid and {good}, which matters a lot in a small apartment.",
]
_COMPLAINTS = [
    "My only complaint is the {a}, which started to {fail} after {dur}.",
    "The {a} is {bad}, and customer service took {days} days to answer my email.",
    "Be careful with the {a}: mine was {bad} out of the box and I had to return it once.",
    "It would get five stars if the {a} were less {bad2}.",
    "The manual says nothing useful about the {a}, so I had to look for videos.",
    "After {dur} the {a} began to {fail}, which is disappointing at this price.",
]
_DETAILS = [
    "For context, I use it {freq} and usually for {use}.",
    "Delivery was quick and the box was well packed, with no plastic at all.",
    "The instructions are short but clear, and the parts fit together without tools.",
    "It is a bit heavier than I expected, but that also makes it feel sturdy.",
    "The color is slightly darker than in the photos, which I actually prefer.",
    "I compared it side by side with a friend's model and the difference is obvious.",
    "Cleaning takes a couple of minutes if you do it right away.",
    "Battery life and power use are about what the listing promises.",
]
_CLOSERS = [
    "Overall I would buy it again and recommend it to anyone on a budget.",
    "All in all, a solid {p} with a few rough edges. Four stars.",
    "I cannot recommend it until the {a} problem is fixed. Two stars.",
    "Great value, does exactly what it says, and looks nice on the counter.",
    "If you need something reliable for daily use, this {p} is a safe choice.",
    "Would I buy it again? Probably, but I would check the {a} first.",
]
_FILL = {
    "when": ["last spring", "two months ago", "during the holiday sale", "in January", "a week ago"],
    "dur": ["three weeks", "a month", "six months", "almost a year", "two years"],
    "good": ["excellent", "really well made", "better than expected", "sturdy", "great"],
    "good2": ["reliable", "comfortable", "powerful", "consistent", "convenient"],
    "bad": ["flimsy", "loose", "noisy", "scratched", "wobbly"],
    "bad2": ["fiddly", "noisy", "cheap-feeling", "awkward", "stiff"],
    "fail": ["rattle", "crack", "wear out", "make a clicking noise", "lose its grip"],
    "mins": ["five", "ten", "fifteen", "twenty"],
    "days": ["three", "five", "eight", "ten"],
    "freq": ["every morning", "twice a week", "most evenings", "on weekends", "several times a day"],
    "use": ["smoothies", "work calls", "long commutes", "weekend trips", "reading at night", "meal prep"],
}


@cache
def chat_lines() -> tuple[str, ...]:
    text = CHAT_LINES_PATH.read_text(encoding="utf-8")
    return tuple(line for line in text.splitlines() if line and not line.startswith("#"))


def _sentence(rng: random.Random, templates: list[str], product: str) -> str:
    slots = {k: rng.choice(v) for k, v in _FILL.items()}
    return rng.choice(templates).format(p=product, a=rng.choice(_PRODUCTS[product]), **slots)


def _review(rng: random.Random, target_words: int, closer: bool = True) -> str:
    """Opener, then body sentences (praise, complaints, details) until about
    target_words, then a closer: the shape of a real product review."""
    product = rng.choice(sorted(_PRODUCTS))
    parts = [_sentence(rng, _OPENERS, product)]
    words = len(parts[0].split())
    while words < target_words:
        kind = rng.choices((_PRAISE, _COMPLAINTS, _DETAILS), weights=(4, 3, 3))[0]
        parts.append(_sentence(rng, kind, product))
        words += len(parts[-1].split())
    if closer:
        parts.append(_sentence(rng, _CLOSERS, product))
    return " ".join(parts)


class TextRequestFactory:
    """Deterministic text requests: make(i) -> (key, value) Kafka message bytes."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._lines = chat_lines()

    def _rng(self, i: int, salt: str = "") -> random.Random:
        # str seeds hash with SHA-512 in random.seed: stable across processes/runs.
        return random.Random(f"tidebatch-text:{self.seed}:{i}:{salt}")

    def text(self, i: int) -> tuple[str, str]:
        """Request i's text and its kind ("short", "medium" or "long")."""
        rng = self._rng(i)
        u = rng.random()
        if u < SHORT_SHARE:
            return rng.choice(self._lines), "short"
        if u < SHORT_SHARE + MEDIUM_SHARE:
            return _review(rng, rng.randint(15, 60), closer=rng.random() < 0.5), "medium"
        tokens = rng.randint(*LONG_TOKENS)
        return _review(rng, int(tokens / TOKENS_PER_WORD) - 24), "long"

    def make(self, i: int) -> tuple[bytes, bytes]:
        text, kind = self.text(i)
        rng = self._rng(i, "meta")
        tenant = rng.choice(TENANTS)
        doc: dict[str, object] = {"request_id": f"text-{self.seed}-{i}", "text": text, "tenant": tenant}
        if kind == "short":
            # chat is interactive: first priority, a tight budget of its own
            doc["priority"] = 0
            doc["deadline_ms"] = 250
        else:
            doc["priority"] = 5  # reviews are indexed in the background
        key = f"{tenant}:user-{rng.randrange(10_000)}".encode()
        return key, orjson.dumps(doc)

    def make_invalid(self, kind: str, i: int = 0, max_chars: int = 100_000) -> tuple[bytes, bytes]:
        """A message the text codec must dead-letter; kind is one of INVALID_KINDS."""
        rid = f"text-invalid-{self.seed}-{i}"
        key = f"invalid:{kind}".encode()
        if kind == "empty_text":
            return key, orjson.dumps({"request_id": rid, "text": ""})
        if kind == "overlong":
            return key, orjson.dumps({"request_id": rid, "text": "a" * (max_chars + 1)})
        if kind == "non_utf8":
            # a Latin-1 "é" (0xE9) where UTF-8 needs two bytes: invalid UTF-8
            return key, b'{"request_id": "' + rid.encode() + b'", "text": "caf\xe9 au lait"}'
        if kind == "missing_text":
            return key, orjson.dumps({"request_id": rid})
        if kind == "mistyped_text":
            return key, orjson.dumps({"request_id": rid, "text": 42})
        raise ValueError(f"unknown invalid kind {kind!r}; choose from {', '.join(INVALID_KINDS)}")
