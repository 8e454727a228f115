"""`tidebatch dlq inspect`: what is in a dead-letter topic, counted by reason (grouped:
pipeline/dlq/letters.py, reason_group), stage and source topic, with its time range
and one sample per reason, and how often replayed requests came back (failed again
after `tidebatch dlq replay`, which skips them unless --again) (pure;
pipeline/dlq/read.py reads the records)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pipeline.dlq.letters import DeadLetter, Selection, reason_group

SAMPLE_VALUE_BYTES = 120
SHOWN_REQUESTS = 5  # requests that came back most often, in the text report (all in --json)


@dataclass
class Summary:
    topic: str
    total: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    stages: Counter[str] = field(default_factory=Counter)
    sources: Counter[str] = field(default_factory=Counter)
    samples: dict[str, DeadLetter] = field(default_factory=dict)  # reason group -> its first record
    truncated: int = 0  # cut to fit the topic: not replayable
    came_back: Counter[str] = field(default_factory=Counter)  # a replayed request's first dead letter -> its returns
    first_ms: int | None = None
    last_ms: int | None = None

    def add(self, letter: DeadLetter) -> None:
        group = reason_group(letter.reason)
        self.total += 1
        self.reasons[group] += 1
        self.stages[letter.stage] += 1
        self.sources[letter.source_topic] += 1
        self.samples.setdefault(group, letter)
        self.truncated += letter.truncated is not None
        if letter.replayed_from is not None:
            self.came_back[letter.origin] += 1
        ts = letter.timestamp_ms
        if ts is not None:
            self.first_ms = ts if self.first_ms is None else min(self.first_ms, ts)
            self.last_ms = ts if self.last_ms is None else max(self.last_ms, ts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "total": self.total,
            "truncated": self.truncated,
            "first_ms": self.first_ms,
            "last_ms": self.last_ms,
            "reasons": [
                {"reason": r, "count": n, "sample": _sample(self.samples[r])} for r, n in self.reasons.most_common()
            ],
            "stages": dict(self.stages.most_common()),
            "source_topics": dict(self.sources.most_common()),
            "came_back": {
                "dead_letters": self.came_back.total(),
                "requests": [{"first_dead_letter": o, "times": n} for o, n in self.came_back.most_common()],
            },
        }


def summarize(topic: str, letters: Iterable[DeadLetter], selection: Selection | None = None) -> Summary:
    summary = Summary(topic)
    for letter in letters:
        if selection is None or selection.matches(letter):
            summary.add(letter)
    return summary


def _sample(letter: DeadLetter) -> dict[str, Any]:
    value = letter.value or b""
    return {
        "dead_letter": letter.where,
        "source": letter.source,
        "reason": letter.reason,
        "value": value[:SAMPLE_VALUE_BYTES].decode("utf-8", "replace"),
        "value_bytes": len(value),
        "truncated": letter.truncated,
    }


def _time(ms: int | None) -> str:
    if ms is None:
        return "?"
    return dt.datetime.fromtimestamp(ms / 1000.0, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def text_lines(summary: Summary) -> list[str]:
    """The report a person reads."""
    if summary.total == 0:
        return [f"{summary.topic}: no dead letters (in the selection)"]
    lines = [
        f"{summary.topic}: {summary.total} dead letters, {_time(summary.first_ms)} .. {_time(summary.last_ms)}",
        "by reason (numbers and ids replaced by N, <id>, <hex>):",
    ]
    for reason, n in summary.reasons.most_common():
        s = _sample(summary.samples[reason])
        lines.append(f"  {n:>8}  {reason}")
        lines.append(f"            e.g. {s['dead_letter']} (request {s['source']}): {s['value']!r}")
    lines.append("by stage: " + ", ".join(f"{k} {n}" for k, n in summary.stages.most_common()))
    lines.append("by source topic: " + ", ".join(f"{k} {n}" for k, n in summary.sources.most_common()))
    if summary.truncated:
        lines.append(f"truncated to fit the topic (cannot be replayed): {summary.truncated}")
    if summary.came_back:
        back = summary.came_back
        lines.append(f"came back from a replay (failed again; `dlq replay` skips them unless --again): "
                     f"{back.total()} dead letters of {len(back)} requests; times each came back, by its first dead letter:")
        lines += [f"  {n:>8}  {o}" for o, n in back.most_common(SHOWN_REQUESTS)]
        if len(back) > SHOWN_REQUESTS:
            lines.append(f"            ... {len(back) - SHOWN_REQUESTS} more (--json lists them all)")
    return lines
