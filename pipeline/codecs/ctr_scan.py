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
_HEX = np.zeros(256, dtype=bool)
_HEX[list(b"0123456789abcdefABCDEF")] = True


# by a key's code (-1 last): a context's features, an item's
_CTX_CODE = np.zeros(F.N_CAT + F.N_DENSE + 1, dtype=bool)
_CTX_CODE[: len(F.CONTEXT_CAT)] = _CTX_CODE[F.N_CAT : F.N_CAT + len(F.CONTEXT_DENSE)] = True
_ITEM_CODE = np.zeros(F.N_CAT + F.N_DENSE + 1, dtype=bool)
_ITEM_CODE[len(F.CONTEXT_CAT) : F.N_CAT] = _ITEM_CODE[F.N_CAT + len(F.CONTEXT_DENSE) : F.N_CAT + F.N_DENSE] = True


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
    code = _feature_code(b, colons)  # C1..C26 -> 0..25, I1..I13 -> 26..38, else -1
    k = np.flatnonzero((is_ctx[owner] & _CTX_CODE[code]) | (is_item[owner] & _ITEM_CODE[code]))
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
    """By the two bytes before a key's closing quote (first << 8 | second): the code of a
    two-character key (letter, 1-9), and of a three-character one (digits 10..26 or
    10..13) when its letter is C or I."""
    two, three_c, three_i = (np.full(1 << 16, -1, dtype=np.int8) for _ in range(3))  # 64 KiB each
    for number in range(1, F.N_CAT + 1):
        text = str(number).encode()
        for letter, limit, base in ((b"C", F.N_CAT, 0), (b"I", F.N_DENSE, F.N_CAT)):
            if number > limit:
                continue
            if len(text) == 1:
                two[letter[0] << 8 | text[0]] = base + number - 1
            else:
                (three_c if letter == b"C" else three_i)[text[0] << 8 | text[1]] = base + number - 1
    return two, three_c, three_i


_TWO, _THREE_C, _THREE_I = _key_tables()


def _feature_code(b: np.ndarray, colons: np.ndarray) -> np.ndarray:
    """The feature each colon's key names: C1..C26 -> 0..25, I1..I13 -> 26..38, or -1.
    Two characters: the bytes before the colon are '"', letter, digit, '"'; three:
    '"', letter, digit, digit, '"'."""
    at = colons - 5
    q5, q4, x3, x2, q1 = (b[k:][at] for k in range(5))
    pair = (x3.astype(np.uint16) << 8) | x2
    three = np.where(q4 == _C, _THREE_C[pair], np.where(q4 == _I, _THREE_I[pair], -1))
    closed = q1 == _QUOTE
    return np.where(closed & (q4 == _QUOTE), _TWO[pair], np.where(closed & (q5 == _QUOTE), three, -1))


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
    words = np.ndarray((len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))  # 8 bytes at each offset
    text = words[quote[eight] + 1]
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
    words = np.ndarray((len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))  # 8 bytes at each offset
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
