"""Models the project has never seen, built in the test with onnx.helper (issue 20):
the user's own model served from configuration (pipeline/registry/user_pipelines.py).

ranker(): two inputs, a dynamic batch dimension and a dynamic sequence dimension:
    dense  float[batch, 4], tokens int64[batch, seq]
    prob   float[batch, 1] = sigmoid(sum(dense @ W + mean(E[tokens], seq)))
    hidden float[batch, 3] = dense @ W + mean(E[tokens], seq)
fixed_batch(): the same dense half with dimension 0 fixed at 1 (not batchable).
odd_outputs(): outputs that are not one row per request (a scalar, a sequence).
masked_encoder(): token ids and an attention mask; a pooled and a per-position output.
tree_classifier(): a tree ensemble with a ZipMap output (list of {class: probability}).
lightgbm_classifier(): a real LightGBM model trained here on generated data and
    converted by onnxmltools (the issue's "model the project has never seen").
forest_with_string_labels(): a scikit-learn random forest converted by skl2onnx, its
    classes strings: label tensor(string), probabilities seq(map(string, tensor(float))).

onnx 1.23 writes IR version 14, which ONNX Runtime 1.31 refuses: both are saved as IR 10
(as models/ctr/build.py does).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

IR_VERSION = 10
OPSET = 13


def _save(graph, path: Path) -> Path:
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tidebatch-test")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def ranker(path: Path, seed: int = 7) -> Path:
    """seed: other weights, the same inputs and outputs (a new version of the model)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")
    e = numpy_helper.from_array(rng.standard_normal((10, 3)).astype(np.float32), "E")
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    nodes = [
        helper.make_node("MatMul", ["dense", "W"], ["h"]),
        helper.make_node("Gather", ["E", "tokens"], ["emb"]),
        helper.make_node("ReduceMean", ["emb"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("Add", ["h", "pooled"], ["hidden"]),
        helper.make_node("ReduceSum", ["hidden", "axes"], ["logit"], keepdims=1),
        helper.make_node("Sigmoid", ["logit"], ["prob"]),
    ]
    graph = helper.make_graph(
        nodes, "ranker",
        [helper.make_tensor_value_info("dense", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["batch", 1]),
         helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", 3])],
        initializer=[w, e, axes],
    )
    return _save(graph, path)


def fixed_batch(path: Path) -> Path:
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 1), dtype=np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        initializer=[w],
    )
    return _save(graph, path)


def masked_encoder(path: Path) -> Path:
    """tokens int64[batch, seq], attention_mask int64[batch, seq] ->
    states float[batch, seq, 3] = E[tokens] * mask (a per-position output) and
    pooled float[batch, 3] = the mean of E[tokens] over the unmasked positions: a model
    that honours its mask, so padding changes nothing."""
    from onnx import TensorProto, helper, numpy_helper

    e = numpy_helper.from_array(np.random.default_rng(11).standard_normal((10, 3)).astype(np.float32), "E")
    one = numpy_helper.from_array(np.array([1], dtype=np.int64), "one")
    two = numpy_helper.from_array(np.array([2], dtype=np.int64), "two")
    nodes = [
        helper.make_node("Gather", ["E", "tokens"], ["emb"]),
        helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "two"], ["m3"]),
        helper.make_node("Mul", ["emb", "m3"], ["states"]),
        helper.make_node("ReduceSum", ["states", "one"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["m3", "one"], ["count"], keepdims=0),
        helper.make_node("Div", ["total", "count"], ["pooled"]),
    ]
    graph = helper.make_graph(
        nodes, "masked",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("states", TensorProto.FLOAT, ["batch", "seq", 3])],
        initializer=[e, one, two],
    )
    return _save(graph, path)


def odd_outputs(path: Path) -> Path:
    """x float[N, 2] -> y float[N, 2] (one row per request), total float[] (the batch's
    sum: a scalar) and parts seq(tensor(float)) (one tensor for the whole batch)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]),
         helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
         helper.make_node("SequenceConstruct", ["x"], ["parts"])], "odd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2]),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
         helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None)],
    )
    return _save(graph, path)


def run_alone(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reference: ONNX Runtime on one request alone (batch of 1)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def tree_classifier(path: Path) -> Path:
    """A tree ensemble classifier as skl2onnx/onnxmltools export one (ai.onnx.ml
    TreeEnsembleClassifier, then ZipMap): x float[batch, 3] -> label int64[batch],
    probabilities seq(map(int64, float)). Two trees of one split each."""
    import onnx
    from onnx import TensorProto, helper

    tree = helper.make_node(
        "TreeEnsembleClassifier", ["x"], ["label", "probs"], domain="ai.onnx.ml",
        nodes_treeids=[0, 0, 0, 1, 1, 1], nodes_nodeids=[0, 1, 2, 0, 1, 2],
        nodes_featureids=[0, 0, 0, 2, 0, 0], nodes_values=[0.5, 0, 0, -1.0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"] * 2,
        nodes_truenodeids=[1, 0, 0, 1, 0, 0], nodes_falsenodeids=[2, 0, 0, 2, 0, 0],
        class_treeids=[0, 0, 0, 0, 1, 1, 1, 1], class_nodeids=[1, 1, 2, 2, 1, 1, 2, 2],
        class_ids=[0, 1] * 4, class_weights=[0.4, 0.1, 0.05, 0.45, 0.3, 0.2, 0.1, 0.4],
        classlabels_int64s=[0, 1], post_transform="NONE",
    )
    zipmap = helper.make_node("ZipMap", ["probs"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[0, 1])
    seq_map = onnx.helper.make_sequence_type_proto(
        onnx.helper.make_map_type_proto(TensorProto.INT64, onnx.helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    graph = helper.make_graph(
        [tree, zipmap], "trees",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
         helper.make_value_info("probabilities", seq_map)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("ai.onnx.ml", 3)],
        producer_name="tidebatch-test")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def lightgbm_classifier(path: Path, features: int = 5, seed: int = 20) -> Path:
    """LightGBM, three classes, trained on `features` generated features; converted by
    onnxmltools with its ZipMap: features float[?, F] -> label int64 (declared [1],
    one per row in fact), probabilities seq(map(int64, tensor(float)))."""
    import lightgbm
    import onnx
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((600, features)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int) + (x[:, 2] > 0.8).astype(int)
    model = lightgbm.LGBMClassifier(n_estimators=25, num_leaves=7, min_child_samples=5, verbose=-1).fit(x, y)
    proto = convert_lightgbm(model, initial_types=[("features", FloatTensorType([None, features]))],
                             target_opset=OPSET, zipmap=True)
    proto.ir_version = min(proto.ir_version, IR_VERSION)  # ONNX Runtime 1.31 reads at most 13
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))
    return path


def forest_with_string_labels(path: Path) -> Path:
    """scikit-learn's random forest on x float[?, 4], classes "cat", "dog", "émeu",
    converted by skl2onnx: output_label string[?], output_probability
    seq(map(string, tensor(float)))."""
    import onnx
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.ensemble import RandomForestClassifier

    rng = np.random.default_rng(4)
    x = rng.standard_normal((300, 4)).astype(np.float32)
    y = np.array(["cat", "dog", "émeu"])[(x[:, 0] > 0).astype(int) + (x[:, 1] > 1).astype(int)]
    model = RandomForestClassifier(n_estimators=5, max_depth=3, random_state=0).fit(x, y)
    proto = to_onnx(model, initial_types=[("x", FloatTensorType([None, 4]))],
                    target_opset={"": OPSET, "ai.onnx.ml": 3})
    proto.ir_version = min(proto.ir_version, IR_VERSION)
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))
    return path


class CsvCodec:
    """A codec class of the user's own (config `codec: tests.own_models:CsvCodec`):
    "id,x0,x1,x2" text lines for tree_classifier()."""

    name = "csv"

    def __init__(self, separator: str = ",") -> None:
        self.separator = separator

    def decode(self, value, headers=None):
        from pipeline.codecs.base import Decoded, DecodeError

        parts = (value or b"").decode("utf-8", "replace").split(self.separator)
        if len(parts) != 4:
            raise DecodeError(f"expected id and 3 numbers, got {len(parts)} parts")
        try:
            x = np.array([[float(p) for p in parts[1:]]], dtype=np.float32)
        except ValueError as exc:
            raise DecodeError(str(exc)) from None
        return Decoded(parts[0], 1, x)

    def collate(self, payloads, pad_to_rows=None):
        x = np.concatenate(payloads)
        if pad_to_rows and pad_to_rows > len(x):
            x = np.concatenate([x, np.zeros((pad_to_rows - len(x), 3), np.float32)])
        return {"x": x}

    def split(self, outputs, decoded):
        return [{"label": int(outputs["label"][i])} for i in range(len(decoded))]

    def sample_request(self, i: int) -> bytes:
        return f"s{i},{i % 3},0.5,-1".replace(",", self.separator).encode()
