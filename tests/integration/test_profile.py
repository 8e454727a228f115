"""`tidebatch profile ctr --quick` for real, on the shipped CTR model: both executors
(a real model process too), the curve file that `tidebatch simulate` then reads, and
the recommended config the worker's own validation accepts; offline, and calibrated
through the embedded broker (pipeline/profiling/calibration.py). Shapes and
consistency only, never a timing: the figures depend on the machine."""

from __future__ import annotations

import json

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.simulate.curves import load_curve


def test_profile_ctr_quick_writes_a_curve_simulate_reads(tmp_path, capsys) -> None:
    assert main(["profile", "ctr", "--quick", "-o", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    doc = json.loads((tmp_path / "curve.json").read_text())
    configs = doc["profile"]["configurations"]
    assert [(c["executor"], c["intra_op_threads"]) for c in configs] == [("in-process", 1), ("model-process", 1)]
    for c in configs:
        rows = [m["rows"] for m in c["measured"]]
        assert rows == sorted(rows) and len(rows) >= 3 and rows[-1] <= 512  # the CTR pipeline's cap
        assert all(m["repeats"] >= 3 and m["model_ms"] > 0 for m in c["measured"])
        assert c["max_batch_rows"] in rows and c["capacity_rows_s"] > 0
    chosen = report["chosen"]
    assert chosen in [{k: v for k, v in c.items() if k != "measured"} for c in configs]
    assert doc["setting"] == {"executor": chosen["executor"], "intra_op_threads": chosen["intra_op_threads"]}
    # No broker: the Kafka work is not measured, and the figure is an upper bound.
    assert report["calibration"] is None and report["upper_bound"] is True
    assert report["predicted_capacity_rows_s"] == min(report["bounds_rows_s"].values())
    assert report["bounds_rows_s"]["model"] <= report["model_capacity_rows_s"] * 1.000001
    assert [p["load"] for p in report["predictions"]] == [0.1, 0.5, 0.9]
    curve = load_curve(str(tmp_path / "curve.json"))
    assert curve.max_batch_rows == chosen["max_batch_rows"] and curve.capacity > 0
    assert main(["simulate", "--curve", str(tmp_path / "curve.json"), "--policies", "adaptive",
                 "--load", "0.5", "--duration", "0.5"]) == 0
    assert "adaptive" in capsys.readouterr().out
    cfg = load_config(tmp_path / "worker.yaml", environ={})
    assert cfg.pipeline == "ctr" and cfg.batching.max_batch_rows == chosen["max_batch_rows"]
    assert cfg.runtime.model_process == (chosen["executor"] == "model-process")


def test_an_unknown_pipeline_is_one_line(tmp_path, capsys) -> None:
    assert main(["profile", "nope", "--quick", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown pipeline 'nope'" in err


def test_a_users_model_from_its_config_and_a_configuration_that_cannot_run_it(tmp_path, capsys) -> None:
    """A `pipelines:` entry is profiled like a shipped pipeline. An output that is a
    sequence of tensors cannot cross the model process's wire (pipeline/runtime/wire.py;
    a ZipMap can since wire_values.py): that configuration is reported as not measured,
    and the in-process one is recommended."""
    import yaml

    from tests.own_models import odd_outputs

    model = odd_outputs(tmp_path / "odd.onnx")
    config = tmp_path / "trees.yaml"
    config.write_text(yaml.safe_dump({"pipeline": "trees", "pipelines": [{
        "name": "trees", "model": str(model), "codec": "tensor-json", "inputs": {"x": "x"},
        "outputs": {"y": "y"}, "max_batch_rows": 64}]}))
    assert main(["profile", "trees", "-c", str(config), "--quick", "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "model-process, 1 thread: not measured" in out
    doc = json.loads((tmp_path / "out" / "curve.json").read_text())
    assert [c["executor"] for c in doc["profile"]["configurations"]] == ["in-process"]
    assert doc["max_batch_rows"] <= 64 and load_curve(str(tmp_path / "out" / "curve.json")).capacity > 0


def test_profile_calibrates_through_a_broker_and_leaves_no_topic_behind(embedded_broker, tmp_path, capsys) -> None:
    """With a broker, a real worker drains the sample requests through scratch topics;
    each of its threads has CPU per request, the prediction is the lowest bound with
    those figures, and the scratch topics are gone afterwards."""
    before = set(embedded_broker.topics())
    args = ["profile", "ctr", "--quick", "--executors", "in-process", "-o", str(tmp_path), "--json",
            "--bootstrap-servers", embedded_broker.bootstrap_servers, "--broker-profile", "embedded",
            "--calibration-requests", "600"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    cal = report["calibration"]
    assert report["upper_bound"] is False and cal["bootstrap"] == embedded_broker.bootstrap_servers
    assert 0 < cal["requests"] < 600 and cal["executors"] == 1 and cal["drained_rows_s"] > 0
    assert cal["drained_requests"] == 600 and cal["window"] == [0.2, 0.9]
    spent = cal["us_per_request"]
    assert all(spent[k] > 0 for k in ("source", "executors", "publisher")) and "broker" not in spent
    assert report["predicted_capacity_rows_s"] == min(report["bounds_rows_s"].values())
    assert report["limited_by"] in report["bounds_rows_s"]
    assert set(embedded_broker.topics()) == before


def test_an_unreachable_calibration_broker_is_one_line(tmp_path, capsys) -> None:
    from consumers.brokers.embedded import free_port

    config = tmp_path / "worker.yaml"
    config.write_text("pipeline: ctr\nkafka_connect_timeout_s: 2\n")
    address = f"127.0.0.1:{free_port()}"
    args = ["profile", "ctr", "-c", str(config), "--quick", "-o", str(tmp_path / "out"), "--bootstrap-servers", address]
    assert main(args) == 2
    # As `run` and `produce` (tests/integration/test_kafka_unreachable.py): the client's
    # warning, then the one line that ends the command, no traceback. Only lines naming
    # this address are this command's: in CI a client left by an earlier test in this
    # process logged its own "unreachable" warning into the same stderr.
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if address in line]
    assert "unreachable" in lines[-1] and len(lines) <= 2, lines
    assert not (tmp_path / "out").exists()  # refused before measuring anything
