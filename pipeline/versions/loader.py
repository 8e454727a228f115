"""The checks a new model version passes before it may serve; its session is opened
the way the worker's first one was (pipeline/runtime/sessions.py).

A candidate is refused unless, with the serving codec (its requests were decoded
for the serving version's inputs and are batched together with the candidate's):
- its session opens (a corrupt or unreadable file fails here);
- its inputs have the serving version's names, in order;
- the warm-up profile runs on the pipeline's sample requests (types and shapes);
- a sample request's outputs split into a result (the outputs the codec reads exist).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from models.registry import ModelSpec
from pipeline.batching.cost import AffineCost
from pipeline.codecs.base import Codec
from pipeline.errors import UserError
from pipeline.runtime.model_process import ProcessSession
from pipeline.runtime.session import InferenceSession
from pipeline.runtime.sessions import open_session
from pipeline.scoring import WARMUP_SEED, ScoringStep

if TYPE_CHECKING:
    from pipeline.config import WorkerConfig
    from pipeline.hooks import WorkerHook
    from pipeline.observe.metrics import WorkerMetrics
    from pipeline.registry.pipelines import PipelineSpec


class VersionLoader:
    """Opens, checks and warms up a new version of `pipeline` for the serving codec."""

    def __init__(
        self,
        cfg: WorkerConfig,
        pipeline: PipelineSpec,
        codec: Codec,
        hooks: Sequence[WorkerHook],
        metrics: WorkerMetrics,
        input_names: Sequence[str],
        batch_sizes: Sequence[int] = (),
        host_address: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.pipeline = pipeline
        self.codec = codec
        self.hooks = list(hooks)
        self.metrics = metrics
        self.input_names = list(input_names)
        self.batch_sizes = tuple(batch_sizes)  # the first version's: its graphs are captured again
        self.host_address = host_address  # a shared model host's: each version opens there too

    def __call__(self, spec: ModelSpec) -> tuple[ScoringStep, AffineCost]:
        restarts = self.metrics.model_restarts.labels(self.cfg.pipeline)
        session = open_session(spec.onnx_path, self.cfg.runtime, restarts.inc, self.batch_sizes, self.host_address)
        try:
            if list(session.input_names) != self.input_names:
                raise UserError(f"its inputs are {session.input_names}, the serving version's {self.input_names}")
            step = ScoringStep(spec, self.codec, session, self.hooks)
            cost = step.warm_up(self.pipeline)
            self._check_outputs(session)
        except BaseException:
            session.close()
            raise
        return step, cost

    def _check_outputs(self, session: InferenceSession | ProcessSession) -> None:
        _key, value, headers = self.pipeline.make_samples(WARMUP_SEED)(0)
        decoded = getattr(self.codec, "inner", self.codec).decode(value, dict(headers))  # samples: documents (base.py)
        outputs, _ = session.run_timed(self.codec.collate([decoded.payload]))
        try:
            self.codec.split(outputs, [decoded])
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise UserError(f"its outputs do not give a result: {type(exc).__name__}: {exc}") from None
