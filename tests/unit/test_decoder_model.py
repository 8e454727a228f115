"""The tiny decoder (models/decoder/): the numpy backward pass against finite
differences, the ONNX graph against the numpy forward pass, greedy decoding with the KV
cache against full recompute, and rows at different positions sharing a batch (issue 25
item 1; docs/GENERATION.md)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnxruntime as ort
import pytest

from models.decoder import tokenizer
from models.decoder.export import input_names, output_names, read_params
from models.decoder.numpy_model import Config, forward, init_params, loss_and_grad, param_shapes
from models.registry import MODELS_DIR, ModelSpec, load_spec

PROMPTS = ["Kafka ", "The scheduler admits", "## Models\n\nThe "]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return load_spec("decoder")


@pytest.fixture(scope="module")
def cfg(spec: ModelSpec) -> Config:
    a = spec.raw["architecture"]
    return Config(vocab=a["vocab"], d_model=a["d_model"], heads=a["heads"], layers=a["layers"],
                  context=a["context"], mlp=a["mlp"])


@pytest.fixture(scope="module")
def session(spec: ModelSpec) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(spec.onnx_path), opts, providers=["CPUExecutionProvider"])


def _empty_cache(cfg: Config, batch: int) -> list[np.ndarray]:
    return [np.zeros((batch, cfg.heads, 0, cfg.head_dim), np.float32)] * (2 * cfg.layers)


def _run(session: ort.InferenceSession, cfg: Config, ids: np.ndarray, positions: np.ndarray,
         mask: np.ndarray, cache: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    feed = dict(zip(input_names(cfg), [ids, positions, mask, *cache], strict=True))
    logits, *present = session.run(None, feed)
    return logits, present


def _prefill(session: ort.InferenceSession, cfg: Config, prompt: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    n = len(prompt)
    return _run(session, cfg, np.array([prompt]), np.arange(n)[None], np.ones((1, n), np.int64),
                _empty_cache(cfg, 1))


def greedy_cached(session: ort.InferenceSession, cfg: Config, prompt: list[int], n: int) -> list[int]:
    logits, cache = _prefill(session, cfg, prompt)
    out = [int(logits[0, -1].argmax())]
    for _ in range(n - 1):
        length = len(prompt) + len(out)  # tokens in the cache after this step
        logits, cache = _run(session, cfg, np.array([[out[-1]]]), np.array([[length - 1]]),
                             np.ones((1, length), np.int64), cache)
        out.append(int(logits[0, -1].argmax()))
    return out


def greedy_recompute(session: ort.InferenceSession, cfg: Config, prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        logits, _ = _prefill(session, cfg, prompt + out)
        out.append(int(logits[0, -1].argmax()))
    return out


# -- numpy ------------------------------------------------------------------------------
def test_backward_matches_finite_differences() -> None:
    cfg = Config(vocab=7, d_model=8, heads=2, layers=2, context=6, mlp=12)
    rng = np.random.default_rng(0)
    # perturbed away from the initialisation, so LayerNorm gains and biases matter
    params = {k: v + rng.normal(0, 0.3, v.shape) for k, v in init_params(cfg, 0, np.float64).items()}
    ids, targets = rng.integers(0, cfg.vocab, (2, 5)), rng.integers(0, cfg.vocab, (2, 5))
    _, grads = loss_and_grad(params, cfg, ids, targets)
    assert set(grads) == set(param_shapes(cfg))
    h = 1e-6
    for name, value in params.items():
        flat = value.reshape(-1)  # a view: perturbing it perturbs params[name]
        for j in rng.choice(flat.size, min(flat.size, 12), replace=False):
            old = flat[j]
            flat[j] = old + h
            up, _ = loss_and_grad(params, cfg, ids, targets)
            flat[j] = old - h
            down, _ = loss_and_grad(params, cfg, ids, targets)
            flat[j] = old
            numeric = (up - down) / (2 * h)
            assert grads[name].reshape(-1)[j] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (name, j)


def test_tokenizer_round_trips_utf8_and_drops_eos() -> None:
    text = "t(step) ≈ a + b·n\n"
    ids = tokenizer.encode(text)
    assert max(ids) < tokenizer.EOS and len(ids) == len(text.encode("utf-8"))
    assert tokenizer.decode(ids + [tokenizer.EOS]) == text


# -- the shipped file ----------------------------------------------------------------
def test_spec_matches_the_file_and_the_graph(spec: ModelSpec, cfg: Config, session: ort.InferenceSession) -> None:
    raw = json.loads((MODELS_DIR / "decoder" / "spec.json").read_text())
    assert hashlib.sha256(spec.onnx_path.read_bytes()).hexdigest() == raw["sha256"]
    assert [t["name"] for t in spec.inputs] == [i.name for i in session.get_inputs()] == input_names(cfg)
    assert [t["name"] for t in spec.outputs] == [o.name for o in session.get_outputs()] == output_names(cfg)
    assert raw["tokenizer"]["vocab"] == tokenizer.VOCAB == cfg.vocab
    assert raw["training"]["heldout_loss"] < raw["training"]["heldout_loss_initial"]


def test_onnx_logits_equal_the_numpy_forward_pass(spec: ModelSpec, cfg: Config,
                                                  session: ort.InferenceSession) -> None:
    params = read_params(str(spec.onnx_path))
    assert {k: v.shape for k, v in params.items()} == param_shapes(cfg)
    prompt = tokenizer.encode("Kafka-native ONNX serving with adaptive micro-batching.")
    expected, _ = forward(params, cfg, np.array([prompt]))
    logits, present = _prefill(session, cfg, prompt)
    np.testing.assert_allclose(logits, expected, atol=1e-3, rtol=1e-3)
    assert present[0].shape == (1, cfg.heads, len(prompt), cfg.head_dim)


@pytest.mark.parametrize("text", PROMPTS)
def test_greedy_with_the_kv_cache_equals_full_recompute(cfg: Config, session: ort.InferenceSession,
                                                        text: str) -> None:
    prompt = tokenizer.encode(text)
    assert greedy_cached(session, cfg, prompt, NEW_TOKENS) == greedy_recompute(session, cfg, prompt, NEW_TOKENS)


def test_rows_at_different_positions_decode_as_each_alone(cfg: Config, session: ort.InferenceSession) -> None:
    """Continuous batching: A has decoded a few tokens when B joins after its own prefill.
    Their caches (different lengths) share one tensor, right-padded with holes the mask
    hides; each row brings its own position. Both must continue exactly as alone."""
    a, b = (tokenizer.encode(t) for t in PROMPTS[1:])
    alone = {0: greedy_cached(session, cfg, a, 20), 1: greedy_cached(session, cfg, b, 12)}
    head_start = 8
    # A's cache holds its prompt and first head_start tokens; the joint step feeds each
    # row's newest token, not yet in its cache: A's token head_start, B's first one.
    rows = [a + alone[0][:head_start], b]
    caches, tokens = [], {0: alone[0][:head_start + 1], 1: []}
    for seq in rows:
        logits, cache = _prefill(session, cfg, seq)
        caches.append(cache)
    tokens[1].append(int(logits[0, -1].argmax()))
    lengths = [len(seq) for seq in rows]
    width = max(lengths)
    cache = [np.concatenate([np.pad(c[k], ((0, 0), (0, 0), (0, width - c[k].shape[2]), (0, 0)))
                             for c in caches]) for k in range(2 * cfg.layers)]
    mask = np.array([[1] * n + [0] * (width - n) for n in lengths], np.int64)
    pos = np.array(lengths)  # next position of each row
    last = np.array([tokens[0][-1], tokens[1][-1]])
    for step in range(11):
        full_mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
        logits, cache = _run(session, cfg, last[:, None], pos[:, None], full_mask, cache)
        if step == 0:  # the holes matter: unmasked, the shorter row scores differently
            short = int(np.argmin(lengths))
            unmasked, _ = _run(session, cfg, last[:, None], pos[:, None], np.ones_like(full_mask),
                               [c[:, :, :-1] for c in cache])
            assert not np.allclose(unmasked[short], logits[short], atol=1e-3)
        mask, pos = full_mask, pos + 1
        last = logits[:, -1].argmax(-1)
        tokens[0].append(int(last[0]))
        tokens[1].append(int(last[1]))
    assert tokens[0] == alone[0][: len(tokens[0])]
    assert tokens[1] == alone[1][: len(tokens[1])]


def test_a_right_padded_prefill_gives_each_prompt_its_own_first_token(cfg: Config,
                                                                      session: ort.InferenceSession) -> None:
    prompts = [tokenizer.encode(t) for t in PROMPTS]
    width = max(map(len, prompts))
    ids = np.array([p + [0] * (width - len(p)) for p in prompts])
    mask = np.array([[1] * len(p) + [0] * (width - len(p)) for p in prompts], np.int64)
    positions = np.tile(np.arange(width), (len(prompts), 1))
    logits, _ = _run(session, cfg, ids, positions, mask, _empty_cache(cfg, len(prompts)))
    for r, p in enumerate(prompts):
        alone, _ = _prefill(session, cfg, p)
        np.testing.assert_allclose(logits[r, len(p) - 1], alone[0, -1], atol=1e-4)
        assert int(logits[r, len(p) - 1].argmax()) == greedy_cached(session, cfg, p, 1)[0]


def test_a_prompt_prefilled_in_chunks_gives_the_logits_of_one_prefill(cfg: Config,
                                                                       session: ort.InferenceSession) -> None:
    """Chunked prefill (GenerationScheduler's prefill_chunk): a chunk of several tokens
    after a non-empty past, the causal mask over the appended columns only."""
    prompt = tokenizer.encode("Iteration-level batching admits and retires at every step.")
    whole, _ = _prefill(session, cfg, prompt)
    cut = 23
    first, cache = _prefill(session, cfg, prompt[:cut])
    rest, present = _run(session, cfg, np.array([prompt[cut:]]), np.arange(cut, len(prompt))[None],
                         np.ones((1, len(prompt)), np.int64), cache)
    np.testing.assert_allclose(np.concatenate([first, rest], axis=1), whole, atol=1e-4)
    assert present[0].shape[2] == len(prompt)
