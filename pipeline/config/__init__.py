"""Worker configuration: one YAML file per deployment, every key overridable by an
environment variable, validated at start with errors that name the key.

Environment overrides: TIDEBATCH_<SECTION>__<KEY>=value (double underscore between
levels), e.g. TIDEBATCH_BATCHING__POLICY=static, TIDEBATCH_BOOTSTRAP_SERVERS=kafka:9092.
Each value is read as its key's declared type (pipeline/config/env.py): strings stay
strings; a variable that names no key is a warning, not an error.
"""

from pipeline.config.load import _coerce, load_config
from pipeline.config.sections import (
    UNDELIVERABLE_ACTIONS,
    BatchingConfig,
    KafkaOverrides,
    LimitsConfig,
    RuntimeConfig,
    WorkerConfig,
)

__all__ = [
    "UNDELIVERABLE_ACTIONS",
    "BatchingConfig",
    "KafkaOverrides",
    "LimitsConfig",
    "RuntimeConfig",
    "WorkerConfig",
    "_coerce",
    "load_config",
]
