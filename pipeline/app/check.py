"""What `tidebatch run` checks before it connects to anything, for `tidebatch config
check` (pipeline/commands/config.py): the extras the config needs, its secret
references, the pipeline, its model, the codec that maps the model's inputs and
outputs, the warm-up's requests and the batching policy, each refused with the one
line `run` prints. Issue 48: `check` said "valid (... group None)" for a config that
`run` refused at its model, and named no group though `run` joins one.

The parts are the ones `run` builds them with (pipeline/app/serve.py, compose.py), so
the two cannot say different things; what `check` skips is what needs the network
(Kafka, Redis) or the model's warm-up run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.config import WorkerConfig


@dataclass(frozen=True)
class Checked:
    """What `run` would serve with this config."""

    pipeline: str
    policy: str
    group_id: str
    model: str  # the model file (or spec.json) served at start
    version: str


def check_config(cfg: WorkerConfig, environ: Mapping[str, str] | None) -> Checked:
    """Raise UserError (run's one line) for what `run` would refuse before it connects;
    `environ` None leaves the secret references unresolved."""
    from pipeline.app.compose import batching_params, group_id_of
    from pipeline.app.serve import require_extras
    from pipeline.batching.registry import make_policy
    from pipeline.registry.pipelines import pipeline_for
    from pipeline.registry.schema_settings import without_registry_secrets

    require_extras(cfg)
    if environ is not None:
        resolve_secrets(cfg, environ)
    pipeline = pipeline_for(cfg)
    model = pipeline.load_model()  # a user's ONNX file is opened by ONNX Runtime here
    # the inputs and outputs mapped onto the model's (a schema-registry codec's client
    # made without its secrets when they are left unresolved)
    pipeline.make_codec(cfg if environ is not None else without_registry_secrets(cfg))
    if cfg.runtime.warmup:
        pipeline.make_samples(0)  # the warm-up's requests (a codec without a sample maker is refused)
    make_policy(cfg.batching.policy, **batching_params(cfg, pipeline.max_batch_rows))
    return Checked(cfg.pipeline, cfg.batching.policy, group_id_of(cfg), str(model.onnx_path), model.version)


def resolve_secrets(cfg: WorkerConfig, environ: Mapping[str, str]) -> None:
    """Resolve every `${VAR}` / `@file:` secret reference `run` would resolve, with
    the helpers `run` uses, and drop the values: a reference that does not resolve
    raises run's one line (the key and the variable or path, never a value). Issue
    44: `check` said "valid" for a file `run` then refused."""
    from consumers.client_settings import ROLES, resolve_secret, settings_for

    for role in ROLES:  # every client's view: a secret set for one client alone counts too
        settings_for(cfg.kafka, role, environ)
    if cfg.metrics.enabled:  # as pipeline/app/serve.py checks it
        from pipeline.ops.http_auth import HttpAuth

        HttpAuth.from_config(cfg.metrics.auth, environ)
    if cfg.schema_registry.url is not None:  # as pipeline/registry/schema_settings.py's make_client
        from pipeline.registry.schema_settings import client_settings

        client_settings(cfg.schema_registry, environ)
    if cfg.redis.used and cfg.redis.password is not None:  # as pipeline/redisio/link.py's make_client
        resolve_secret("redis.password", cfg.redis.password, environ, "config key")
