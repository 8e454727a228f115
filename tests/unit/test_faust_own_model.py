"""The Faust path on a user's `pipelines:` entry (pipeline/faust/inference.py
served_config, BatchScorer(config=...); examples/faust_ctr/app.py): the config's entry
resolved as the worker resolves it, scored with the same model and codec; an unknown
pipeline stops the app with one line naming the setting."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml

from pipeline.errors import UserError
from pipeline.faust.inference import BatchScorer, served_config
from pipeline.registry.pipelines import pipeline_for
from tests.own_models import ranker, run_alone

pytest.importorskip("onnx")

APP = Path(__file__).resolve().parents[2] / "examples" / "faust_ctr" / "app.py"


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("own")
    model = ranker(folder / "ranker.onnx")
    path = folder / "ranker.yaml"
    path.write_text(yaml.safe_dump({
        "pipeline": "my-ranker", "output_topic": "ranked", "result_headers": ["x-trace"],
        "pipelines": [{"name": "my-ranker", "model": str(model), "version": "4", "max_batch_rows": 24,
                       "inputs": {"features": "dense", "tokens": "tokens"}, "outputs": {"score": "prob"}}],
    }))
    return path


def test_an_unknown_pipeline_names_the_variable_and_the_configs_pipelines(config: Path) -> None:
    with pytest.raises(UserError) as bare:
        served_config(None, "my-ranker")
    assert str(bare.value) == (
        "TIDEBATCH_FAUST_PIPELINE 'my-ranker': unknown pipeline; shipped pipelines: camera, ctr, text; a pipeline "
        "of your own is a `pipelines:` entry of a worker config (TIDEBATCH_FAUST_CONFIG; docs/OWN_MODEL.md)")
    with pytest.raises(UserError, match=r"'nope': unknown pipeline; .*defined under the config's pipelines: my-ranker$"):
        served_config(str(config), "nope")
    assert served_config(str(config), "text").pipeline == "text"  # a shipped one instead of the config's


def test_the_scorer_serves_the_configs_entry_with_the_workers_model_and_codec(config: Path) -> None:
    cfg = served_config(str(config), None)
    worker = pipeline_for(cfg)  # what pipeline/app/compose.py builds the worker from
    scorer = BatchScorer(config=cfg, providers="cpu", warmup=False, in_thread=False)
    try:
        assert (scorer.pipeline.name, scorer.model.name, scorer.model.version) == ("my-ranker", "my-ranker", "4")
        assert scorer.model.onnx_path == worker.load_model().onnx_path
        assert type(scorer.codec) is type(worker.make_codec(cfg)) and scorer.codec.results == {"score": "prob"}
        doc = {"request_id": "a", "features": [0.5, -1.0, 2.0, 0.25], "tokens": [1, 2, 3]}
        (result,), _ = scorer.infer([scorer.codec.decode(orjson.dumps(doc))])
        alone = run_alone(cfg.pipelines[0]["model"], {"dense": np.array([doc["features"]], np.float32),
                                                      "tokens": np.array([doc["tokens"]])})
        assert np.array(result["score"], np.float32).tobytes() == alone["prob"][0].tobytes()
    finally:
        scorer.close()
    with pytest.raises(ValueError, match="with config="):
        BatchScorer("ctr", config=cfg, warmup=False)


def test_the_example_app_takes_the_configs_pipeline_and_topics(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("faust", reason="faust-streaming is not installed (the [faust] extra)")
    monkeypatch.setenv("TIDEBATCH_FAUST_CONFIG", str(config))
    app = runpy.run_path(str(APP))
    assert (app["SPEC"].name, app["APP_ID"], app["INPUT_TOPIC"], app["OUTPUT_TOPIC"], app["DLQ_TOPIC"]) == (
        "my-ranker", "tidebatch-faust-my-ranker", "my-ranker.requests", "ranked", "my-ranker.requests.dlq")
    assert app["MAX_BATCH_ROWS"] == 24 and app["metrics"].pipeline == "my-ranker"
    monkeypatch.setenv("TIDEBATCH_FAUST_PIPELINE", "nope")
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(APP))
    assert str(stop.value.code).startswith("TIDEBATCH_FAUST_PIPELINE 'nope': unknown pipeline;")
