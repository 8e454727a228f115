"""How tidebatch's own log lines look: level and format (`text`, or one JSON object per
line for log collectors such as Loki, Elasticsearch or Cloud Logging).

The level and format come from `--log-level` / `--log-format` (before or after the
subcommand, pipeline/cli.py), else the worker config's `log_level` / `log_format`
(`TIDEBATCH_LOG_LEVEL`, `TIDEBATCH_LOG_FORMAT`), else INFO and text. An unknown level
is refused: it used to become INFO without a word.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

import orjson

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601 with ms), level, logger, message,
    and the exception's traceback as one string when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """(Re)configure the root logger: one stderr handler with `fmt`, at `level`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler], force=True)
