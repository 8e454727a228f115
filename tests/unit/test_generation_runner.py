"""The decoder runner (pipeline/generation/runner.py): Plans of the generation scheduler
run on the shipped decoder's ONNX graph. Sequences decoded together, joining and
leaving at different steps, must give token for token what each gives alone, and what
the numpy reference (models/decoder/numpy_model.py) gives by full recompute."""

from __future__ import annotations

import numpy as np
import pytest

from models.decoder import tokenizer
from models.decoder.export import read_params
from models.decoder.numpy_model import Config, forward
from models.registry import load_spec
from pipeline.generation.budget import KvBudget
from pipeline.generation.policies import make_generation_policy
from pipeline.generation.runner import DecoderRunner, DecoderShape, gen_request, open_decoder
from pipeline.generation.scheduler import GenerationScheduler
from pipeline.generation.sequence import Outcome
from pipeline.generation.slot_decoder import InPlaceDecoder, open_in_place
from pipeline.generation.stream import Generation, stop_bytes

PROMPTS = ["Kafka ", "The scheduler admits", "## Models\n\nThe ", "A worker", "Offsets commit"]
LENGTHS = [12, 30, 7, 21, 16]


@pytest.fixture(scope="module")
def decoder() -> tuple[object, DecoderShape]:
    return open_decoder("cpu")


@pytest.fixture(scope="module")
def in_place(decoder: tuple[object, DecoderShape]) -> InPlaceDecoder:
    session, shape = decoder
    made = open_in_place(str(session.path), shape)
    assert made is not None, "this ONNX Runtime has no CPU GroupQueryAttention"
    return made


def _drive(decoder: tuple[object, DecoderShape], gens: list[Generation], *, policy: str = "continuous",
           slots: int = 4, chunk: int | None = None, stagger: int = 0,
           in_place: InPlaceDecoder | None = None) -> tuple[dict[str, Outcome], DecoderRunner]:
    """Run requests to the end on a fake clock: one tick per step; request i arrives at
    step i * stagger, so later ones join sequences already decoding."""
    session, shape = decoder
    sched = GenerationScheduler(make_generation_policy(policy), KvBudget(slots, slots * shape.context),
                                prefill_chunk=chunk)
    runner = DecoderRunner(session, shape, slots, in_place)
    done: dict[str, Outcome] = {}
    step, pending = 0, list(enumerate(gens))
    while pending or sched.has_work:
        while pending and pending[0][0] * stagger <= step:
            _, g = pending.pop(0)
            assert sched.submit(gen_request(g, float(step), 1e9)) is None
        plan = sched.plan(float(step))
        if not plan.empty:
            before = runner.calls
            result = runner.run(plan)
            assert runner.calls - before <= 2  # one call for prefill chunks, one for decoding
            assert set(result.tokens) == {s.request_id for s in plan.emitting}
            for o in sched.complete(plan, float(step), result.stopped):
                done[o.request.request_id] = o
        step += 1
    return done, runner


def _gens(temperature: float = 0.0) -> list[Generation]:
    return [Generation(f"r{i}", tokenizer.encode(p), n, temperature) for i, (p, n) in
            enumerate(zip(PROMPTS, LENGTHS, strict=True))]


@pytest.fixture(scope="module")
def reference() -> tuple[dict, Config]:
    """The numpy reference model with the shipped decoder's weights (read once)."""
    spec = load_spec("decoder")
    a = spec.raw["architecture"]
    cfg = Config(vocab=a["vocab"], d_model=a["d_model"], heads=a["heads"], layers=a["layers"],
                 context=a["context"], mlp=a["mlp"])
    return read_params(str(spec.onnx_path)), cfg


def _numpy_picks(reference: tuple[dict, Config], prompt: list[int], tokens: list[int]) -> list[int]:
    """The token the numpy reference picks greedily after the prompt and each prefix of
    `tokens`, by full recompute (no cache): one causal forward over prompt + tokens gives
    them all, since the logits at position j see tokens 0..j only. Equal to `tokens`
    means a greedy loop on the reference would have generated the same tokens."""
    params, cfg = reference
    logits, _ = forward(params, cfg, np.array([prompt + tokens]))
    start = len(prompt) - 1
    return [int(i) for i in logits[0, start:start + len(tokens)].argmax(-1)]


def test_greedy_sequences_decoded_together_give_what_each_gives_alone(decoder, reference) -> None:
    alone = {}
    for g in _gens():
        _drive(decoder, [g], policy="none", slots=1)
        alone[g.request_id] = g.tokens
    for chunk in (None, 5):
        together = _gens()
        done, _ = _drive(decoder, together, slots=3, chunk=chunk, stagger=3)
        assert set(done) == {g.request_id for g in together}
        for g in together:
            assert g.tokens == alone[g.request_id], (chunk, g.request_id)
            assert done[g.request_id].generated == len(g.tokens)
    for g in _gens()[:3]:  # the numpy reference, by full recompute (slow: three are enough)
        tokens = alone[g.request_id]
        assert _numpy_picks(reference, g.prompt, tokens) == tokens
        # and it stops where a greedy loop stops: at the first EOS, else after max_new_tokens
        assert tokenizer.EOS not in tokens[:-1]
        assert len(tokens) == g.max_new_tokens or tokens[-1] == tokenizer.EOS


def test_in_place_decoding_across_admissions_and_retirements_gives_what_each_gives_alone(decoder, in_place) -> None:
    """Decoding steps in place on the slots (pipeline/generation/slot_decoder.py):
    sequences join at staggered steps, retire at their own lengths and their slots are
    reused, and every one still gets, token for token, what it gets alone through the
    gathered cache (which the test above checks against the numpy reference)."""
    alone = {}
    for g in _gens():
        _drive(decoder, [g], policy="none", slots=1)
        alone[g.request_id] = g.tokens
    for policy, chunk, stagger in (("continuous", None, 3), ("continuous", 5, 2), ("static", None, 1),
                                   ("none", None, 0)):
        together = _gens()
        done, runner = _drive(decoder, together, policy=policy, slots=3, chunk=chunk, stagger=stagger,
                              in_place=in_place)
        assert {g.request_id: g.tokens for g in together} == alone, (policy, chunk)
        assert all(done[g.request_id].generated == len(g.tokens) for g in together)
        # every slot is free again at length 0: a step that runs it in range attends to nothing
        assert not runner.lengths.any(), policy


def test_an_in_place_step_writes_one_column_per_decoding_row_and_nothing_else(decoder, in_place) -> None:
    """Its logits are the shipped graph's on the same caches, each decoding slot gets
    its new key and value at its own length, and nothing else of the cache moves but the
    column a row in range that does not decode will overwrite next (its length)."""
    session, shape = decoder
    rng = np.random.default_rng(3)
    slots, lengths = 6, np.array([7, 0, 40, 19, 3, 11], np.int64)
    cache = [np.zeros((slots, shape.heads, shape.context, shape.head_dim), np.float32)
             for _ in range(2 * shape.layers)]
    for c in cache:
        for s, n in enumerate(lengths):
            c[s, :, :n] = rng.normal(0, 1, (shape.heads, n, shape.head_dim))
    before = [c.copy() for c in cache]
    rows = {3: 65, 0: 66, 2: 67}  # slot 1 (free) sits in the range and does not decode; 4, 5 are outside it
    got = in_place.step(cache, lengths, rows)
    for i, (slot, token) in enumerate(rows.items()):
        n = int(lengths[slot])
        feeds = {"input_ids": np.array([[token]]), "positions": np.array([[n]]),
                 "attention_mask": np.ones((1, n + 1), np.int64)}
        for li in range(shape.layers):
            feeds[f"past_key_{li}"] = before[2 * li][slot:slot + 1, :, :n]
            feeds[f"past_value_{li}"] = before[2 * li + 1][slot:slot + 1, :, :n]
        want = session.run(feeds)
        np.testing.assert_allclose(got[i], want["logits"][0, 0], rtol=1e-4, atol=1e-4)
        for ci, kind in enumerate(("key", "value") * shape.layers):
            np.testing.assert_allclose(cache[ci][slot, :, n], want[f"present_{kind}_{ci // 2}"][0, :, n],
                                       rtol=1e-5, atol=1e-5)
    for c, b in zip(cache, before, strict=True):
        changed = np.argwhere((c != b).any(axis=(1, 3)))  # (slot, column) pairs
        assert {tuple(x) for x in changed} <= {(0, 7), (2, 40), (3, 19), (1, 0)}
        assert {(0, 7), (2, 40), (3, 19)} <= {tuple(x) for x in changed}


def test_static_batching_runs_the_same_tokens_and_reuses_slots(decoder) -> None:
    gens = _gens()
    _drive(decoder, gens, policy="static", slots=2)
    alone = _gens()
    _drive(decoder, alone, policy="none", slots=1)
    assert [g.tokens for g in gens] == [g.tokens for g in alone]


def test_sampling_is_seeded_per_request(decoder) -> None:
    first, second = _gens(0.9), _gens(0.9)
    _drive(decoder, first, slots=4, stagger=2)
    _drive(decoder, second, policy="none", slots=1)
    assert [g.tokens for g in first] == [g.tokens for g in second]
    greedy = _gens()
    _drive(decoder, greedy, policy="none", slots=1)
    assert [g.tokens for g in first] != [g.tokens for g in greedy]
    other = [Generation(g.request_id, g.prompt, g.max_new_tokens, 0.9, seed=7) for g in _gens()]
    _drive(decoder, other, slots=4)
    assert [g.tokens for g in other] != [g.tokens for g in first]


def test_a_stop_string_ends_the_sequence_and_stays_out_of_the_text(decoder) -> None:
    probe = Generation("p", tokenizer.encode(PROMPTS[1]), 30)
    _drive(decoder, [probe], policy="none", slots=1)
    full = tokenizer.decode(probe.tokens)
    stop = full[10:13]
    cut = full.index(stop)
    g = Generation("p", probe.prompt, 30, stop=stop_bytes([stop, "never-seen"]))
    done, _ = _drive(decoder, [g], policy="none", slots=1)
    assert done["p"].reason == "stop"
    assert g.text == full[:cut]
    assert len(g.tokens) == cut + len(stop)


def test_a_plan_past_the_context_is_refused(decoder) -> None:
    session, shape = decoder
    g = Generation("long", [65] * shape.context, 2)
    sched = GenerationScheduler(make_generation_policy("none"), KvBudget(1, 10 * shape.context))
    runner = DecoderRunner(session, shape, 1)
    sched.submit(gen_request(g, 0.0, 1e9))
    plan = sched.plan(0.0)
    sched.complete(plan, 0.0, runner.run(plan).stopped)
    with pytest.raises(ValueError, match="context"):
        runner.run(sched.plan(1.0))


def test_a_slot_reused_by_a_sequence_one_position_on_starts_from_its_own_cache(decoder) -> None:
    """The runner reuses the last decoding call's outputs while its rows stay. A's last
    decoding step fed position 6 in slot 0; B, prefilled into slot 0 next, first
    decodes at position 7: the same slot one position on, yet none of A's cache."""
    a = Generation("a", tokenizer.encode("Kafka"), 3)
    b = Generation("b", tokenizer.encode("## Mode"), 60)
    _drive(decoder, [a, b], policy="none", slots=1)
    alone = Generation("b", b.prompt, 60)
    _drive(decoder, [alone], policy="none", slots=1)
    assert len(a.prompt) + len(a.tokens) - 2 + 1 == len(b.prompt)  # the coincidence this is about
    assert b.tokens == alone.tokens
