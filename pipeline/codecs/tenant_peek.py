"""A request's tenant read from its JSON bytes without decoding it.

Why: admission routes some of a poll's records late before decoding them
(pipeline/worker/admission.py, pipeline/batching/shed.py), and with tenant classes it
sheds the records of classes over their share first (docs/BATCHING.md, "Tenants on the
real pipeline"). That order needs each record's tenant before the decode it saves.
A hint, not a parse: a tenant this cannot read plainly (escapes, a non-string, no
field) reads as None, i.e. the default class, and the decode later sets the request's
real tenant for everything else (deadline, tier, metrics).

Pure.
"""

from __future__ import annotations

import re

# The top-level "tenant" member of a compact or spaced JSON object, its string value
# without escapes. Escaped or odd values are left to the decoder.
_TENANT = re.compile(rb'"tenant"\s*:\s*"([^"\\]{0,256})"')


def peek_tenant(json_bytes: bytes | None) -> str | None:
    """The tenant string of a JSON request, or None when it is not plainly there."""
    if not json_bytes:
        return None
    m = _TENANT.search(json_bytes)
    if m is None:
        return None
    try:
        return m.group(1).decode("utf-8")
    except UnicodeDecodeError:
        return None
