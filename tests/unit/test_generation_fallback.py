"""The runner's fallback when the in-place decoder cannot be built
(pipeline/generation/slot_decoder.py `open_in_place`): one warning line, and decoding
steps go through the shipped graph with the KV cache gathered
(pipeline/generation/runner.py `_call`), as on an ONNX Runtime build without CPU
GroupQueryAttention or with a provider other than cpu.

The in-place decoder is made unavailable the way the field does it: ORT itself refuses
the graph it is given (an operator it has no kernel for), the graph builder fails, or
the provider is not cpu; each through open_in_place's own parameters, the call
pipeline/app/generation.py makes. Then continuous, static and none scheduling, with
staggered admissions and more requests than slots, must give each request token for
token what it gets decoded alone."""

from __future__ import annotations

import logging

import pytest

from models.decoder.numpy_model import Config, Params
from pipeline.generation.runner import DecoderShape, open_decoder
from pipeline.generation.slot_decoder import in_place_graph, open_in_place
from pipeline.generation.stream import Generation
from tests.unit.test_generation_runner import _drive, _gens

LOGGER = "pipeline.generation.slot_decoder"


@pytest.fixture(scope="module")
def decoder() -> tuple[object, DecoderShape]:
    return open_decoder("cpu")


def _without_gqa_kernel(params: Params, cfg: Config):  # -> onnx.ModelProto
    """The real in-place graph with its attention nodes naming an operator this ORT has
    no kernel for: what a build without the com.microsoft GroupQueryAttention CPU kernel
    is handed (ORT refuses it at session creation, not this test)."""
    model = in_place_graph(params, cfg)
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention":
            node.op_type = "GroupQueryAttentionNotInThisBuild"
    return model


def _builder_fails(params: Params, cfg: Config):  # -> onnx.ModelProto
    raise ImportError("onnx has no com.microsoft opset here\nsecond line that must not be logged")


def _one_warning(caplog: pytest.LogCaptureFixture) -> str:
    records = [r for r in caplog.records if r.name == LOGGER]
    assert len(records) == 1, [r.getMessage() for r in records]
    assert records[0].levelno == logging.WARNING
    line = records[0].getMessage()
    assert "\n" not in line
    assert line.endswith("decoding steps gather the KV cache")
    return line


def test_ort_refusing_the_in_place_graph_gives_none_and_one_warning_line(decoder, caplog) -> None:
    session, shape = decoder
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        made = open_in_place(str(session.path), shape, build=_without_gqa_kernel)
    assert made is None
    line = _one_warning(caplog)
    assert line.startswith("in-place decoding unavailable (")
    assert "GroupQueryAttentionNotInThisBuild" in line  # ORT's own first line says what it refused


def test_a_failing_graph_builder_gives_none_and_one_warning_line(decoder, caplog) -> None:
    session, shape = decoder
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert open_in_place(str(session.path), shape, build=_builder_fails) is None
    assert "onnx has no com.microsoft opset here" in _one_warning(caplog)


@pytest.mark.parametrize("provider", ["cuda", "auto"])
def test_a_provider_other_than_cpu_gives_none_and_one_warning_line(decoder, caplog, provider: str) -> None:
    session, shape = decoder
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert open_in_place(str(session.path), shape, provider=provider) is None
    assert f"provider {provider}" in _one_warning(caplog)


def test_the_cpu_provider_with_the_real_graph_builds_the_in_place_decoder(decoder, caplog) -> None:
    """The other side of the tests above: nothing falls back, nothing is logged."""
    session, shape = decoder
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert open_in_place(str(session.path), shape, provider="cpu") is not None
    assert not [r for r in caplog.records if r.name == LOGGER]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_fallback_decodes_what_each_request_gets_alone(decoder, caplog, temperature: float) -> None:
    """Greedy and seeded sampling: each request alone in one slot, then all five through
    three slots with staggered arrivals (later ones join sequences already decoding,
    retired slots are reused), under every policy; token for token the same."""
    session, shape = decoder
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        fallback = open_in_place(str(session.path), shape, build=_without_gqa_kernel)
    assert fallback is None
    alone: dict[str, list[int]] = {}
    for g in _gens(temperature):
        _drive(decoder, [g], policy="none", slots=1, in_place=fallback)
        alone[g.request_id] = g.tokens
    assert all(alone.values())
    for policy, chunk, stagger in (("continuous", None, 3), ("continuous", 5, 2), ("continuous", None, 0),
                                   ("static", None, 2), ("static", None, 0), ("none", None, 1)):
        together: list[Generation] = _gens(temperature)
        done, runner = _drive(decoder, together, policy=policy, slots=3, chunk=chunk, stagger=stagger,
                              in_place=fallback)
        assert runner.in_place is None
        assert {g.request_id: g.tokens for g in together} == alone, (policy, chunk, stagger)
        assert all(done[g.request_id].generated == len(g.tokens) for g in together)
        assert not runner.lengths.any(), policy  # every slot free again
