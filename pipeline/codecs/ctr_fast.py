"""The CTR JSON requests of a whole poll, decoded together (CtrCodec.decode_many):
msgspec checks each request's skeleton, ctr_scan.py reads every feature value of the
poll from the bytes at once, and one hash (models/ctr/features.py ``hash_ids``) makes
the ids of all rows.

Same answer as CtrCodec.decode, or none: a request this path doubts in any way comes
back as None and the codec decodes it the reference way (ctr.py), so a refused
request gets exactly the reference's one-line reason and an accepted one the same
features bit for bit (tests/unit/test_ctr_fast.py compares both on generated and
edge-case requests). Doubted here: not ASCII and not valid UTF-8 (msgspec skips an
unknown field's string without checking it), any backslash (an escape may hide a
quote or spell a token), any blank byte (ctr_scan.py reads compact JSON), whatever msgspec refuses against the skeleton below, any
field value the reference would refuse or change (request_id length, priority
0..9, deadline_ms beyond int64, 1..max_items items, empty item_id), and what
ctr_scan.py doubts.

Why msgspec for the skeleton: it checks the whole document's JSON and the types of the
fields it declares, and skips the ~400 feature values without making an object for
any (~11 us a request against orjson's ~75 us for the whole document; figures in
docs/schemas/ctr_request.md, "Speed: the JSON fast path").
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import msgspec
import numpy as np

from models.ctr import features as F
from pipeline.codecs import ctr_scan, jsonnum
from pipeline.codecs.base import Decoded
from pipeline.codecs.ctr_features import CtrPayload
from pipeline.codecs.ctr_fields import MAX_REQUEST_ID_CHARS

_N_CTX_CAT, _N_CTX_DENSE = len(F.CONTEXT_CAT), len(F.CONTEXT_DENSE)
GROUP_BYTES = 512 * 1024
MIN_GROUP = 4


class _Item(msgspec.Struct, gc=False):
    item_id: str


class _Context(msgspec.Struct, gc=False):
    """Only that it is an object: its values are ctr_scan.py's."""


class _Request(msgspec.Struct, gc=False):
    request_id: str
    context: _Context
    items: list[_Item]
    tenant: str | None = None
    priority: int | None = None
    deadline_ms: int | None = None
    user_id: str | None = None


_SKELETON = msgspec.json.Decoder(_Request)
_ITEM_ID = attrgetter("item_id")


def _skeleton(value: bytes | None, max_items: int) -> _Request | None:
    """The request's checked skeleton, or None where the reference path must decide."""
    if not value or b"\\" in value or _has_blank(value):
        return None
    if not value.isascii():
        try:
            value.decode("utf-8")
        except (UnicodeDecodeError, AttributeError):
            return None
    try:
        req = _SKELETON.decode(value)
    except (msgspec.DecodeError, RecursionError):  # DecodeError: also msgspec.ValidationError
        return None
    if not 0 < len(req.request_id) <= MAX_REQUEST_ID_CHARS or not 0 < len(req.items) <= max_items:
        return None
    if req.priority is not None and not 0 <= req.priority <= 9:
        return None
    if req.deadline_ms is not None and not 0 < req.deadline_ms <= jsonnum.INT64_MAX:
        return None
    return req


def _has_blank(value: bytes) -> bool:
    return b" " in value or b"\n" in value or b"\t" in value or b"\r" in value


def decode_json(values: Sequence[bytes | None], max_items: int) -> list[Decoded | None]:
    """A Decoded per JSON request, in order, or None for one the reference must decode.

    The requests are read in groups of about GROUP_BYTES: every step of ctr_scan.py
    makes a few arrays the size of its group's bytes, and at this size they come from
    the heap (a worker maps each block over 1 MiB afresh, pipeline/runtime/allocator.py,
    a page fault per 4 KiB) and stay in the cache. A group costs ~100 numpy calls
    whatever its size, more than the reference decode of a request or two: fewer than
    MIN_GROUP requests are left to the reference (a poll of 1 took 2.6x longer this
    way, bench/ctr_codec.py --poll 1), and a short last group joins the one before."""
    out: list[Decoded | None] = [None] * len(values)
    if len(values) < MIN_GROUP:
        return out
    groups: list[list[tuple[int, bytes, _Request]]] = [[]]
    size = 0
    for i, value in enumerate(values):
        req = _skeleton(value, max_items)
        if req is None:
            continue
        if size >= GROUP_BYTES:
            groups.append([])
            size = 0
        groups[-1].append((i, value, req))  # type: ignore[arg-type]  # _skeleton refused None
        size += len(value)  # type: ignore[arg-type]
    if len(groups) > 1 and len(groups[-1]) < MIN_GROUP:
        groups[-2].extend(groups.pop())
    if len(groups[0]) >= MIN_GROUP:
        for group in groups:
            _decode_group(group, out)
    return out


def _decode_group(group: list[tuple[int, bytes, _Request]], out: list[Decoded | None]) -> None:
    """Fill ``out`` at the group's indices with the requests ctr_scan.py did not doubt."""
    n_items = np.fromiter((len(req.items) for _, _, req in group), dtype=np.intp, count=len(group))
    s = ctr_scan.scan([value for _, value, _ in group], n_items)
    counts, n = s.rows, len(group)
    # the item rows get their request's context columns; then one hash for all
    for array, width in ((s.tokens, _N_CTX_CAT), (s.present, _N_CTX_CAT), (s.dense, _N_CTX_DENSE)):
        array[n:, :width] = np.repeat(array[:n, :width], counts, axis=0)
    cat = F.hash_ids(s.tokens[n:], s.present[n:])
    dense = s.dense[n:]
    at = 0
    for (i, _, req), n, doubt in zip(group, counts.tolist(), s.doubt.tolist(), strict=True):
        items = req.items
        if not doubt and n == len(items):
            ids = list(map(_ITEM_ID, items))
            if "" not in ids:
                out[i] = Decoded(
                    request_id=req.request_id,
                    rows=n,
                    payload=CtrPayload(dense[at : at + n], cat[at : at + n]),
                    priority=0 if req.priority is None else req.priority,
                    deadline_ms=req.deadline_ms,
                    tenant=req.tenant,
                    extra={"item_ids": ids},
                )
        at += n
