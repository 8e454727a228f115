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
from pipeline.generation.stream import Generation, stop_bytes

PROMPTS = ["Kafka ", "The scheduler admits", "## Models\n\nThe ", "A worker", "Offsets commit"]
LENGTHS = [12, 30, 7, 21, 16]


@pytest.fixture(scope="module")
def decoder() -> tuple[object, DecoderShape]:
    return open_decoder("cpu")


def _drive(decoder: tuple[object, DecoderShape], gens: list[Generation], *, policy: str = "continuous",
           slots: int = 4, chunk: int | None = None, stagger: int = 0) -> tuple[dict[str, Outcome], DecoderRunner]:
    """Run requests to the end on a fake clock: one tick per step; request i arrives at
    step i * stagger, so later ones join sequences already decoding."""
    session, shape = decoder
    sched = GenerationScheduler(make_generation_policy(policy), KvBudget(slots, slots * shape.context),
                                prefill_chunk=chunk)
    runner = DecoderRunner(session, shape, slots)
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


def _numpy_greedy(prompt: list[int], n: int) -> list[int]:
    spec = load_spec("decoder")
    a = spec.raw["architecture"]
    cfg = Config(vocab=a["vocab"], d_model=a["d_model"], heads=a["heads"], layers=a["layers"],
                 context=a["context"], mlp=a["mlp"])
    params = read_params(str(spec.onnx_path))
    out: list[int] = []
    for _ in range(n):
        logits, _ = forward(params, cfg, np.array([prompt + out]))
        out.append(int(logits[0, -1].argmax()))
        if out[-1] == tokenizer.EOS:
            break
    return out


def test_greedy_sequences_decoded_together_give_what_each_gives_alone(decoder) -> None:
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
        assert alone[g.request_id] == _numpy_greedy(g.prompt, g.max_new_tokens)


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
