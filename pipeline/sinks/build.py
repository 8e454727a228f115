"""Build a worker's offline sinks from its `sinks` config section."""

from __future__ import annotations

import logging
from typing import Any

from pipeline.sinks import ResultSink

log = logging.getLogger(__name__)


def build_sinks(cfg: Any) -> list[ResultSink]:
    """The enabled sinks of a WorkerConfig (pyarrow is imported only when one is)."""
    sinks: list[ResultSink] = []
    pc = cfg.sinks.parquet
    if pc.enabled:
        from pipeline.registry.pipelines import pipeline_for
        from pipeline.sinks.parquet import ParquetSink

        model = pipeline_for(cfg).load_model().name  # names the model= directory
        sinks.append(ParquetSink(pc, cfg.pipeline, model))
        log.info(
            "parquet sink at %s (roll %d rows / %d bytes / %.0f s record time, max open %.0f s)",
            pc.path, pc.roll_rows, pc.roll_bytes, pc.roll_interval_s, pc.max_open_s,
        )
    return sinks
