"""The feature values of many CTR JSON requests, read from their bytes by a few numpy
passes over a whole poll: no Python object per value.

Why: today's decode (ctr.py) makes ~430 Python objects a request (orjson: a str per
token, an int per count, a dict per item) and then walks them again to gather, check
and hash them: most of its time (profile in docs/schemas/ctr_request.md, "Speed: the
JSON fast path"). Here a poll's requests are joined into one buffer and each step is one numpy call
over all of them.

Precondition, checked per request by ctr_fast.py before a request gets here: valid
JSON that msgspec has read against the request's skeleton (so ``context`` is an object
and ``items`` a list of n objects), valid UTF-8, no backslash and no blank byte (space,
tab, CR, LF) anywhere. This module adds a *plain* check: exactly 2 + n ``{`` and ``}``
(the request, its context, its items) and one ``[`` and ``]`` (the items) in its bytes.
Then no string holds a brace, bracket or quote, no unknown field holds an object or an
array, and:

* every brace and bracket is structure, so their running sum is the nesting depth: the
  context is the ``{`` at depth 2, the items are the ``{`` at depth 3;
* a colon belongs to the object of the last ``{`` before it unless a ``}`` or ``[``
  came between (then it is a top-level key's);
* the 5 bytes before a colon are ``"C14"``, or end in ``"C1"``, exactly when its key is
  C14 or C1 (a quote followed by a letter cannot close a string in compact valid JSON, and no
  string holds a quote), and the byte after it starts the value: ``"``, ``n`` (null), a
  digit or ``-``.

What this reading cannot take the way ctr.py would, it does not guess: the request is
marked ``doubt`` and ctr_fast.py sends it to ctr.py's decode, which knows the exact
rules and the one-line reasons. That is: a request that is not plain, a feature value
that is neither null, a string of 1..16 hex digits (tokens) nor an integer of at most
7 digits (counts; a float or a longer integer changes how ctr_features.py rounds and
clips the whole request, and 10**7 is far above the counts seen), and a feature key
given twice in one object (ctr.py keeps the last; numpy promises no order of writes).
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from models.ctr import features as F

_QUOTE, _COLON, _MINUS, _NULL, _COMMA = (ord(c) for c in '":-n,')
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET = (ord(c) for c in "{}[]")
_C, _I = ord("C"), ord("I")
_HEX_TOKEN = re.compile(rb"[0-9a-fA-F]{1,16}\Z")  # as models/ctr/features.py's _HEX_TOKEN
_PAD = b" " * 16  # before and after the requests: reads a few bytes around a colon stay inside
_ZEROS = np.uint64(0x3030303030303030)  # "00000000"
_LANES = np.uint64(0x000000FF000000FF)
_MUL_A, _MUL_B = np.uint64(100 + (1000000 << 32)), np.uint64(1 + (10000 << 32))
_8, _16, _32 = np.uint64(8), np.uint64(16), np.uint64(32)  # shifts of a word's bytes
_HEX = np.zeros(256, dtype=bool)
_HEX[list(b"0123456789abcdefABCDEF")] = True


class Scan(NamedTuple):
    """The features of n requests with R item rows in all: row r < n is request r's
    context (its C1..C13 and I1..I6 columns), row n + k the poll's k-th item (its
    C14..C26 and I7..I13 columns); the other columns are left for the caller."""

    rows: np.ndarray  # intp [n]: item objects found per request
    tokens: np.ndarray  # uint64 [n + R, 26]: int(token, 16), 0 where missing
    present: np.ndarray  # bool [n + R, 26]
    dense: np.ndarray  # float32 [n + R, 13]: the count, NaN where missing
    doubt: np.ndarray  # bool [n]: not read here, ctr.py decodes it


def scan(values: list[bytes], n_items: np.ndarray) -> Scan:
    """Read the features of requests that meet the module's precondition; ``n_items``
    is each one's number of items (msgspec's)."""
    n = len(values)
    buf = b"".join([_PAD, *values, _PAD])
    b = np.frombuffer(buf, dtype=np.uint8)
    starts = np.empty(n, dtype=np.intp)
    starts[0] = len(_PAD)
    np.cumsum(np.fromiter(map(len, values), dtype=np.intp, count=n)[:-1], out=starts[1:])
    starts[1:] += len(_PAD)

    # every colon, brace and bracket, in order ("[" | 0x20 is "{", "]" | 0x20 is "}")
    low = b | 0x20
    marks = np.flatnonzero((b == _COLON) | (low == _LBRACE) | (low == _RBRACE))
    kind = b[marks]
    is_event = kind != _COLON
    last_event = np.cumsum(is_event) - 1  # at a colon: the brace or bracket before it
    events, event_kind = marks[is_event], kind[is_event]
    event_req = np.searchsorted(starts, events, side="right") - 1
    depth = np.cumsum(np.where((event_kind | 0x20) == _LBRACE, 1, -1))  # after each event
    # from each request's own start: a brace inside a string of a request that is not
    # plain (doubted below) must not shift the depths of the requests after it
    first = np.searchsorted(events, starts)
    depth -= np.where(first > 0, depth[first - 1], 0)[event_req]
    doubt = _not_plain(event_req, event_kind, n_items, n)
    is_item = (event_kind == _LBRACE) & (depth == 3)
    is_ctx = (event_kind == _LBRACE) & (depth == 2)
    rows = np.bincount(event_req[is_item], minlength=n)
    total = int(np.count_nonzero(is_item))
    # the row each event's object fills: its request's context row, or its item's row
    event_row = np.where(is_item, n + np.cumsum(is_item) - 1, event_req)

    colons = marks[~is_event]
    owner = last_event[~is_event]
    code, side = _feature_keys(buf, colons)
    opens = (is_ctx * _CTX | is_item * _ITEM).astype(np.uint8)  # the object each event opens (exclusive)
    # the colons of a context's features in a context, and of an item's in an item
    k = np.flatnonzero(opens[owner] & side)
    at, c, owner = colons[k], code[k], owner[k]
    row, req = event_row[owner], event_req[owner]
    _refuse_repeats(doubt, req, row * (F.N_CAT + F.N_DENSE) + c, (n + total) * (F.N_CAT + F.N_DENSE))

    tokens = np.zeros((n + total) * F.N_CAT, dtype=np.uint64)
    present = np.zeros((n + total) * F.N_CAT, dtype=bool)
    dense = np.full((n + total) * F.N_DENSE, np.nan, dtype=np.float32)
    value = b[at + 1]  # the first byte of the value: '"', 'n' (null), a digit or '-'
    is_token = c < F.N_CAT
    string = is_token & (value == _QUOTE)
    number = ~is_token & (((value - ord("0")) < 10) | (value == _MINUS))
    doubt[req[~(string | number | (value == _NULL))]] = True
    s = np.flatnonzero(string)
    got, ok = _tokens(buf, b, at[s] + 1)
    slot = row[s] * F.N_CAT + c[s]
    tokens[slot] = got
    present[slot] = True
    doubt[req[s[~ok]]] = True
    d = np.flatnonzero(number)
    got, ok = _counts(buf, at[d] + 1)
    dense[row[d] * F.N_DENSE + (c[d] - F.N_CAT)] = got
    doubt[req[d[~ok]]] = True
    return Scan(
        rows,
        tokens.reshape(-1, F.N_CAT),
        present.reshape(-1, F.N_CAT),
        dense.reshape(-1, F.N_DENSE),
        doubt,
    )


def _not_plain(event_req: np.ndarray, event_kind: np.ndarray, n_items: np.ndarray, n: int) -> np.ndarray:
    """Requests whose braces and brackets are not exactly their own objects' and array's."""
    def count(k: int) -> np.ndarray:
        return np.bincount(event_req[event_kind == k], minlength=n)

    objects = 2 + n_items
    return (count(_LBRACE) != objects) | (count(_RBRACE) != objects) | (count(_LBRACKET) != 1) | (count(_RBRACKET) != 1)


def _key_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """By a key's selector and pair (see _feature_keys): its feature code (C1..C26 ->
    0..25, I1..I13 -> 26..38), whose object holds it (_CTX, _ITEM, 0 for no feature),
    and the selector of the byte before the pair."""
    code = np.zeros(4 << 16, dtype=np.int8)
    side = np.zeros(4 << 16, dtype=np.uint8)
    for number in range(1, F.N_CAT + 1):
        text = str(number).encode()
        for letter, limit, base, context in ((b"C", F.N_CAT, 0, F.CONTEXT_CAT), (b"I", F.N_DENSE, F.N_CAT, F.CONTEXT_DENSE)):
            if number > limit:
                continue
            if len(text) == 1:  # '"', letter, digit, '"': the letter and the digit
                at = _SEL_TWO | letter[0] | text[0] << 8
            else:  # '"', letter, digit, digit, '"': the two digits, after C or I
                at = (_SEL_C if letter == b"C" else _SEL_I) | text[0] | text[1] << 8
            code[at] = base + number - 1
            side[at] = _CTX if number <= len(context) else _ITEM
    sel = np.full(256, _SEL_NONE, dtype=np.intp)
    sel[_QUOTE], sel[_C], sel[_I] = _SEL_TWO, _SEL_C, _SEL_I
    return code, side, sel


_CTX, _ITEM = 1, 2
_SEL_TWO, _SEL_C, _SEL_I, _SEL_NONE = 0, 1 << 16, 2 << 16, 3 << 16
_KEY_CODE, _KEY_SIDE, _KEY_SEL = _key_tables()


def _feature_keys(buf: bytes, colons: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The feature each colon's key names (C1..C26 -> 0..25, I1..I13 -> 26..38) and
    the object a feature of that name belongs in (_CTX, _ITEM; 0: no feature, its code
    then meaningless). A key of two characters ends in '"', letter, digit, '"' before
    its colon, one of three in '"', letter, digit, digit, '"'. The five bytes are read
    as one little-endian word: its byte 1 (the letter of a three-character key, the
    quote of a two-character one) picks the table, bytes 2 and 3 index it, byte 4
    must be the closing quote and byte 0 the opening one of a three-character key."""
    w = _words(buf)[colons - 5]
    at = _KEY_SEL.take((w >> _8).astype(np.uint8)) | (w >> _16).astype(np.uint16)
    closed = (w >> _32).astype(np.uint8) == _QUOTE
    closed &= (at < _SEL_C) | (w.astype(np.uint8) == _QUOTE)
    return _KEY_CODE.take(at), _KEY_SIDE.take(at) * closed


def _words(buf: bytes) -> np.ndarray:
    """The 8 bytes at each offset of ``buf`` as a little-endian integer."""
    return np.ndarray((len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))


def _refuse_repeats(doubt: np.ndarray, req: np.ndarray, slot: np.ndarray, slots: int) -> None:
    """Doubt the requests where one object gives a feature key twice (one slot per
    row and feature)."""
    seen = np.zeros(slots, dtype=bool)
    seen[slot] = True
    if np.count_nonzero(seen) == len(slot):
        return
    twice = np.bincount(slot, minlength=slots)[slot] > 1
    doubt[req[twice]] = True


def _tokens(buf: bytes, b: np.ndarray, quote: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int(token, 16) of the strings opened at ``quote``, and whether each is 1..16 hex
    digits. 8 digits (Criteo's shape), the common case, all in one ``bytes.fromhex``
    of their joined text: it makes exactly 4 bytes per token only if every character is
    a hex digit (it skips blanks and refuses other characters; no string holds a quote,
    so 8 hex digits after the quote are the whole token when a quote follows them).
    Other lengths, one by one."""
    values = np.zeros(len(quote), dtype=np.uint64)
    ok = np.ones(len(quote), dtype=bool)
    eight = b[quote + 9] == _QUOTE
    text = _words(buf)[quote[eight] + 1]
    try:
        raw = bytes.fromhex(text.tobytes().decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        raw = b""
    if len(raw) != 4 * len(text):  # some are not: find them, read the others
        hexes = _HEX[text.view(np.uint8).reshape(-1, 8)].all(axis=1)
        eight[eight] = hexes
        raw = bytes.fromhex(text[hexes].tobytes().decode("ascii"))
    values[eight] = np.frombuffer(raw, dtype=">u4")
    for j in np.flatnonzero(~eight).tolist():
        start = int(quote[j]) + 1
        token = buf[start : buf.index(b'"', start)]
        if _HEX_TOKEN.match(token):
            values[j] = int(token, 16)
        else:
            ok[j] = False
    return values, ok


def _counts(buf: bytes, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The integer literals at ``start`` as float32, the way ctr_features.py turns an
    int (through a double: np.array(ints, float32) converts each via PyFloat_AsDouble),
    and whether each is one: at most 7 digits, then "," or "}" (not ".", "e" or more
    digits). The digits are read 8 bytes at a time (SWAR: Lemire, "Fast number parsing
    without fallback"): moved to the top bytes behind '0's, then summed pairwise."""
    words = _words(buf)
    neg = np.frombuffer(buf, dtype=np.uint8)[start] == _MINUS
    word = words[start + neg]
    text = word.view(np.uint8).reshape(-1, 8)
    n_digits = np.argmin((text - ord("0")) < 10, axis=1)  # the first non-digit; 0 if all 8 are digits
    after = text[np.arange(len(start)), n_digits]
    ok = (n_digits >= 1) & ((after == _COMMA) | (after == _RBRACE))
    shift = (8 * (8 - np.where(ok, n_digits, 8))).astype(np.uint64)  # 0 digits where not ok
    x = (word << shift) | (_ZEROS >> (np.uint64(64) - shift))
    x = x - _ZEROS
    x = x * np.uint64(10) + (x >> np.uint64(8))
    x = ((x & _LANES) * _MUL_A + ((x >> np.uint64(16)) & _LANES) * _MUL_B) >> np.uint64(32)
    number = x.astype(np.int64)
    return np.where(neg, -number, number).astype(np.float64).astype(np.float32), ok
