"""pipeline/runtime/wire_values.py: what the model process carries besides numeric
arrays (string tensors, a ZipMap's sequence of maps) comes back equal, with the same
Python types ONNX Runtime gives in-process. Pure: no process, no socket."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.runtime.wire_values import SEP, carried, pack, unpack


def roundtrip(values: dict) -> dict:
    arrays, packed = pack(values)
    assert all(isinstance(a, np.ndarray) and not a.dtype.hasobject for a in arrays.values())
    return unpack(arrays, packed)


def test_numeric_arrays_pass_as_they_are_and_nothing_is_packed():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    arrays, packed = pack({"x": x})
    assert arrays["x"] is x and packed == {}
    assert unpack(arrays, packed)["x"] is x


def test_string_tensor_comes_back_equal_in_its_shape():
    s = np.array([["cat", ""], ["émeu", "狗\U0001f415"]], dtype=object)
    back = roundtrip({"label": s})["label"]
    assert back.dtype == object and back.shape == (2, 2) and back.tolist() == s.tolist()


def test_zipmap_maps_come_back_equal_with_int_and_string_keys_in_output_order():
    probs = np.float32([0.54399729, 0.42029164, 1 / 3])
    int_maps = [{0: float(probs[0]), 1: float(probs[1]), 2: float(probs[2])}, {0: 1.0, 1: 0.0, 2: 0.0}]
    str_maps = [{"cat": 0.25, "dog": 0.75}, {}, {"émeu": 1.0}]  # sizes may differ
    label = np.array([0, 1], dtype=np.int64)
    back = roundtrip({"label": label, "probabilities": int_maps, "named": str_maps})
    assert list(back) == ["label", "probabilities", "named"]
    assert back["probabilities"] == int_maps and back["named"] == str_maps
    assert [type(k) for k in back["probabilities"][0]] == [int] * 3  # keys as ONNX Runtime gives them
    assert type(back["probabilities"][0][0]) is float and back["probabilities"][0][0] == float(probs[0])  # exact


def test_integer_values_and_an_empty_sequence():
    back = roundtrip({"counts": [{"a": 3, "b": -(2**40)}], "none": []})
    assert back == {"counts": [{"a": 3, "b": -(2**40)}], "none": []}
    assert type(back["counts"][0]["a"]) is int


@pytest.mark.parametrize(("value", "reason"), [
    ({"a": 1.0}, "'y' is a dict, which the model process cannot carry"),
    ([np.zeros(2)], "'y' is a list, which the model process cannot carry"),
    ([{"a": np.zeros(2)}], "'y' holds a ndarray, which the model process cannot carry"),
])
def test_what_cannot_be_carried_is_a_one_line_type_error(value, reason):
    with pytest.raises(TypeError) as exc:
        pack({"y": value})
    assert str(exc.value) == reason


@pytest.mark.parametrize(("type_text", "ok"), [
    ("tensor(float)", True), ("tensor(string)", True),
    ("seq(map(int64,tensor(float)))", True), ("seq(map(string,tensor(double)))", True),
    ("seq(tensor(float))", False), ("map(int64,tensor(float))", False), ("optional(tensor(float))", False),
])
def test_carried_names_the_types_unpack_rebuilds(type_text, ok):
    assert carried(type_text) is ok


def test_part_names_cannot_collide_with_an_output_name():
    arrays, _ = pack({"p": [{0: 0.5}], "p_keys": np.zeros(1)})
    assert set(arrays) == {f"p{SEP}keys", f"p{SEP}values", f"p{SEP}counts", "p_keys"}
