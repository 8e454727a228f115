"""Every codec against mutated valid requests (issue 22): each message decodes into a
result that serialises, or is refused with a one-line DecodeError; decode_many agrees
with decode. Fixed seed and message counts, so a failure replays exactly; the
long-form fuzzer with timings is bench/fuzz_codecs.py (same mutators)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fuzz_mutators import Target, check_batch, mutate, targets

SEED = 22
MESSAGES = {"ctr": 300, "ctr_binary": 300, "ctr_id": 200, "text": 300, "camera": 60, "tensor_json": 300, "tensor_binary": 300}
BATCH = 20  # messages per decode_many call


@pytest.fixture(scope="module")
def all_targets() -> dict[str, Target]:
    return {t.name: t for t in targets(SEED)}


def test_every_codec_is_fuzzed(all_targets: dict[str, Target]) -> None:
    assert set(all_targets) == set(MESSAGES)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_mutated_requests_decode_or_are_refused_cleanly(all_targets: dict[str, Target], name: str) -> None:
    target = all_targets[name]
    rng = np.random.default_rng([SEED, sorted(MESSAGES).index(name)])
    outcomes: list[str] = []
    for _ in range(MESSAGES[name] // BATCH):
        batch = [mutate(rng, target) for _ in range(BATCH)]
        try:
            outcomes += check_batch(target.codec, [m for _, m in batch])
        except AssertionError as exc:
            raise AssertionError(f"{name}, mutations {[n for n, _ in batch]}: {exc}") from None
    # both outcomes occur, or the mutators have stopped reaching the codec's checks
    assert "ok" in outcomes and any(o.startswith("refused") for o in outcomes)
    assert check_batch(target.codec, target.samples) == ["ok"] * len(target.samples)
