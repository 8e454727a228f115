"""The decoder as an ONNX graph with an explicit KV cache, written with onnx.helper.

One graph serves prefill (seq = prompt length, past = 0) and decoding (seq = 1), and a
batch may hold sequences at different positions, as continuous batching needs
(docs/GENERATION.md): each row brings its own positions and a mask over its past and
new tokens, so rows whose caches have different lengths share one padded cache tensor.

Inputs
  input_ids        int64 [batch, seq]
  positions        int64 [batch, seq]           each token's position in its sequence (< context)
  attention_mask   int64 [batch, past + seq]    1 = a real token, 0 = a hole or padding
  past_key_i, past_value_i  float32 [batch, heads, past, head_dim], i = 0..layers-1
Outputs
  logits           float32 [batch, seq, vocab]
  present_key_i, present_value_i  float32 [batch, heads, past + seq, head_dim]
                   (the past with this call's keys and values appended along axis 2)

The in-place variant (`build_graph(..., in_place=True)`, built from the same weights
when the runner opens the decoder: pipeline/generation/slot_decoder.py) is for decoding
steps only. Its attention is ONNX Runtime's GroupQueryAttention (com.microsoft), which
reads each row's cache up to that row's own length and writes the new key and value
into the cache it was given when present_* are bound to the past_* buffers:
  input_ids, positions   int64 [batch, seq]
  seqlens_k              int32 [batch]   tokens in the row's cache after this call, minus 1
  total_sequence_length  int32 []        the largest of seqlens_k + 1
  past_key_i, past_value_i  float32 [batch, heads, context, head_dim] (the slots' caches)
  outputs: logits, present_key_i, present_value_i (the same buffers, updated)
Why: with the graph above a batch pays for its longest row's cache in every row, and
the whole cache is copied into present_* by the Concat on every call
(docs/GENERATION.md, "Where a step's time went").

Attention: new token j of a row attends to key column c when attention_mask[row, c] is
1 and c <= past + j (causal over the appended columns). Masked scores are set to -1e9,
not -inf, so a padding query whose keys are all masked gives numbers, not NaN (its
logits mean nothing and are the caller's to ignore). Everything else is what
models/decoder/numpy_model.py `forward` computes, which the tests check.
"""

from __future__ import annotations

import numpy as np

from models.decoder.numpy_model import GELU_C, LN_EPS, MASKED, Config, Params

# names nodes and initializers uniquely; models/text/build.py writes its graph with it too
from models.text.build import _Graph

OPSET = 17  # LayerNormalization is opset 17
IR_VERSION = 10  # onnx 1.23 writes IR 14 by default, which ONNX Runtime 1.31 refuses


def input_names(cfg: Config) -> list[str]:
    names = ["input_ids", "positions", "attention_mask"]
    for i in range(cfg.layers):
        names += [f"past_key_{i}", f"past_value_{i}"]
    return names


def output_names(cfg: Config) -> list[str]:
    names = ["logits"]
    for i in range(cfg.layers):
        names += [f"present_key_{i}", f"present_value_{i}"]
    return names


def build_graph(params: Params, cfg: Config, props: dict[str, str] | None = None,
                in_place: bool = False):  # -> onnx.ModelProto
    """The model with its weights inline. Initializer names are the parameter names of
    numpy_model.py, so the weights can be read back from the file. in_place: the
    decoding-step variant on GroupQueryAttention (module docstring)."""
    import onnx
    from onnx import TensorProto, helper

    g = _Graph()
    for name, value in params.items():
        g.const(name, value.astype(np.float32))
    f32 = np.float32
    g.const("heads_shape", np.array([0, 0, cfg.heads, cfg.head_dim], np.int64))
    g.const("model_shape", np.array([0, 0, cfg.d_model], np.int64))
    g.const("qkv_split", np.array([cfg.d_model] * 3, np.int64))
    g.const("scale", np.array(cfg.head_dim**-0.5, f32))
    g.const("masked", np.array(MASKED, f32))
    g.const("half", np.array(0.5, f32))
    g.const("one", np.array(1.0, f32))
    g.const("gelu_c", np.array(GELU_C, f32))
    g.const("gelu_k", np.array(0.044715, f32))
    g.const("zero", np.array(0, np.int64))
    g.const("step", np.array(1, np.int64))
    g.const("axes0", np.array([0], np.int64))
    g.const("axes1", np.array([1], np.int64))
    g.const("axes12", np.array([1, 2], np.int64))

    x = g.op("Add", [g.op("Gather", ["tok_emb", "input_ids"]), g.op("Gather", ["pos_emb", "positions"])])

    allowed = "" if in_place else _allowed(g)

    for i in range(cfg.layers):
        p = f"l{i}."
        h = g.op("LayerNormalization", [x, p + "ln1.g", p + "ln1.b"], axis=-1, epsilon=LN_EPS)
        qkv = g.op("Add", [g.op("MatMul", [h, p + "qkv.w"]), p + "qkv.b"])
        ctx = (_fused_attention if in_place else _attention)(g, cfg, i, qkv, allowed)
        x = g.op("Add", [x, g.op("Add", [g.op("MatMul", [ctx, p + "proj.w"]), p + "proj.b"])])
        h2 = g.op("LayerNormalization", [x, p + "ln2.g", p + "ln2.b"], axis=-1, epsilon=LN_EPS)
        f = g.op("Add", [g.op("MatMul", [h2, p + "fc1.w"]), p + "fc1.b"])
        # tanh GELU, 0.5·f·(1 + tanh(c·(f + k·f³))), as numpy_model._gelu
        cube = g.op("Mul", [g.op("Mul", [f, f]), f])
        inner = g.op("Mul", [g.op("Add", [f, g.op("Mul", [cube, "gelu_k"])]), "gelu_c"])
        gelu = g.op("Mul", [g.op("Mul", [f, "half"]), g.op("Add", [g.op("Tanh", [inner]), "one"])])
        x = g.op("Add", [x, g.op("Add", [g.op("MatMul", [gelu, p + "fc2.w"]), p + "fc2.b"])])
    hf = g.op("LayerNormalization", [x, "lnf.g", "lnf.b"], axis=-1, epsilon=LN_EPS)
    # tied output projection: one copy of the table in the file, transposed in the graph
    g.nodes.append(helper.make_node("MatMul", [hf, g.op("Transpose", ["tok_emb"], perm=[1, 0])], ["logits"]))

    cache_in = ["batch", cfg.heads, "past", cfg.head_dim]
    cache_out = ["batch", cfg.heads, "total", cfg.head_dim]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("positions", TensorProto.INT64, ["batch", "seq"])]
    if in_place:
        cache_in = cache_out = ["batch", cfg.heads, "context", cfg.head_dim]
        inputs += [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
                   helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    else:
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]))
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", cfg.vocab])]
    for i in range(cfg.layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_{kind}_{i}", TensorProto.FLOAT, cache_in))
            outputs.append(helper.make_tensor_value_info(f"present_{kind}_{i}", TensorProto.FLOAT, cache_out))
    graph = helper.make_graph(g.nodes, "tidebatch_decoder", inputs, outputs, initializer=g.inits)
    opsets = [helper.make_opsetid("", OPSET)] + ([helper.make_opsetid("com.microsoft", 1)] if in_place else [])
    model = helper.make_model(graph, opset_imports=opsets,
                              producer_name="tidebatch.models.decoder.build")
    model.ir_version = IR_VERSION
    if props:
        helper.set_model_props(model, props)
    onnx.checker.check_model(model)
    return model



def _allowed(g):  # -> name of allowed[b, 0, j, c] = attention_mask[b, c] and c <= past + j
    from onnx import TensorProto

    past = g.op("Squeeze", [g.op("Shape", ["past_key_0"], start=2, end=3), "axes0"])
    seq = g.op("Squeeze", [g.op("Shape", ["input_ids"], start=1, end=2), "axes0"])
    total = g.op("Add", [past, seq])
    key_idx = g.op("Unsqueeze", [g.op("Range", ["zero", total, "step"]), "axes0"])  # [1, total]
    query_idx = g.op("Unsqueeze", [g.op("Range", [past, total, "step"]), "axes1"])  # [seq, 1]
    causal = g.op("LessOrEqual", [key_idx, query_idx])  # [seq, total]
    keep = g.op("Unsqueeze", [g.op("Cast", ["attention_mask"], to=TensorProto.BOOL), "axes12"])
    return g.op("And", [causal, keep])  # [batch, 1, seq, total]


def _attention(g, cfg: Config, i: int, qkv: str, allowed: str) -> str:
    """Layer i's attention over the past with this call's keys appended (present_*)."""
    from onnx import helper

    q, k, v = (g.op("Transpose", [g.op("Reshape", [t, "heads_shape"])], perm=[0, 2, 1, 3])
               for t in g.op("Split", [qkv, "qkv_split"], n_out=3, axis=-1))
    key, value = f"present_key_{i}", f"present_value_{i}"  # graph outputs, used below too
    g.nodes.append(helper.make_node("Concat", [f"past_key_{i}", k], [key], axis=2))
    g.nodes.append(helper.make_node("Concat", [f"past_value_{i}", v], [value], axis=2))
    scores = g.op("MatMul", [g.op("Mul", [q, "scale"]), g.op("Transpose", [key], perm=[0, 1, 3, 2])])
    attn = g.op("Softmax", [g.op("Where", [allowed, scores, "masked"])], axis=-1)
    return g.op("Reshape", [g.op("Transpose", [g.op("MatMul", [attn, value])], perm=[0, 2, 1, 3]),
                            "model_shape"])


def _fused_attention(g, cfg: Config, i: int, qkv: str, allowed: str) -> str:
    """Layer i's attention as GroupQueryAttention: causal over each row's own
    seqlens_k + 1 tokens, the new key and value written at the row's position in the
    cache (in place when present_* are bound to the past_* buffers)."""
    from onnx import helper

    q, k, v = g.op("Split", [qkv, "qkv_split"], n_out=3, axis=-1)
    out = f"attention_{i}"
    g.nodes.append(helper.make_node(
        "GroupQueryAttention", [q, k, v, f"past_key_{i}", f"past_value_{i}", "seqlens_k", "total_sequence_length"],
        [out, f"present_key_{i}", f"present_value_{i}"], domain="com.microsoft",
        num_heads=cfg.heads, kv_num_heads=cfg.heads, scale=cfg.head_dim**-0.5))
    return out


def read_params(path: str) -> Params:
    """The parameters back from a built file (initializers named as in numpy_model.py)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if "." in t.name
            or t.name in ("tok_emb", "pos_emb")}
