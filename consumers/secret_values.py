"""Secrets hidden by what they are, not by the key they sit under.

Redacting a settings dump by key name (consumers/client_settings.py `redacted`) keeps a
secret out of the lines the project builds itself. It cannot keep one out of text that
someone else wrote: librdkafka's debug lines, an exception's message, a traceback, a
repr of a dict that a new log line forgets to redact. So every secret value the project
resolves is also registered here (`resolve_secret` does it), and the log formatters
(pipeline/observe/logs.py) and the CLI's error line (pipeline/cli.py) pass their finished text
through `scrub`, which replaces any registered value, wherever it appears, by `***`.
Handlers the project does not set up (`faust worker` installs its own) are covered by
`scrub_log_records`, which masks each record's message as it is made.

A value is registered in the forms it takes in printed text: as it is, escaped as a
Python repr or a JSON string shows it (a PEM key's newlines become `\\n`), and, for a
multi-line value such as a PEM private key, each of its long lines on its own (a
library that quotes one line of a key it could not parse still leaks it).

Values shorter than MIN_LENGTH are not scrubbed: replacing every "ab" in every line
would mangle the logs, and a secret that short is no secret. Paths (`*.location`) are
not registered: the file's contents are the secret, and an error naming the path is
what an operator needs.
"""

from __future__ import annotations

import json
import logging
import threading

MIN_LENGTH = 4
# A PEM body line is 64 characters; shorter lines (the last one, BEGIN/END markers) are
# either too short to matter alone or public text.
_MIN_LINE = 16
MASK = "***"


class SecretValues:
    """The secret values this process knows, and text with them masked. Thread-safe:
    log records are formatted in whatever thread logs them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._forms: tuple[str, ...] = ()

    def register(self, value: object) -> None:
        """Remember `value` (and the forms it is printed in) as a secret."""
        text = "" if value is None else str(value)
        if len(text.strip()) < MIN_LENGTH:
            return
        forms = set(_printed_forms(text))
        with self._lock:
            known = set(self._forms)
            if forms <= known:
                return
            # Longest first, so a whole key is masked before any of its lines is.
            self._forms = tuple(sorted(known | forms, key=len, reverse=True))

    def scrub(self, text: str) -> str:
        """`text` with every registered secret replaced by ***."""
        forms = self._forms  # a tuple, replaced whole: no lock needed to read it
        for form in forms:
            if form in text:
                text = text.replace(form, MASK)
        return text

    def clear(self) -> None:
        """Forget every value (tests only)."""
        with self._lock:
            self._forms = ()

    def __len__(self) -> int:
        return len(self._forms)


def _printed_forms(text: str) -> list[str]:
    forms = [text, text.strip()]
    forms.append(text.encode("unicode_escape").decode("ascii", "replace"))  # repr()'s \n, \t
    forms.append(json.dumps(text)[1:-1])  # a JSON log line's escaping
    for line in text.splitlines():
        line = line.strip()
        if len(line) >= _MIN_LINE and not line.startswith("-----"):
            forms.append(line)
    return [f for f in forms if len(f) >= MIN_LENGTH]


# The process's one registry: secrets are resolved in many places (the kafka: block, the
# ops endpoints' credentials, Redis), and every printed line must be checked against all.
SECRETS = SecretValues()


def scrub(text: str) -> str:
    """`text` with every secret this process resolved masked."""
    return SECRETS.scrub(text)


_factory_lock = threading.Lock()
_factory_installed = False


def scrub_log_records() -> None:
    """Mask known secrets in every log record's message as the record is made, so that
    handlers and formatters of other libraries (Faust's) print none either. Idempotent.
    A record is only rewritten (message formatted, args dropped) when it held a secret;
    records below a logger's level are never made, so quiet DEBUG costs nothing."""
    global _factory_installed
    with _factory_lock:
        if _factory_installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: object, **kwargs: object) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if len(SECRETS):
                try:
                    message = record.getMessage()
                except Exception:  # a bad format string is logging's to report, not ours
                    return record
                masked = SECRETS.scrub(message)
                if masked != message:
                    record.msg, record.args = masked, ()
            return record

        logging.setLogRecordFactory(factory)
        _factory_installed = True
