"""The built-in dashboard in a real browser: headless Chromium (over the DevTools
protocol, tests/integration/chromium.py) opens a live worker's page while requests
flow; the charts must keep gaining data points, and a screenshot goes to
out/dashboard.png for a human to look at."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pipeline.app.produce import produce
from tests.integration.chromium import HeadlessChromium, find_chromium
from tests.integration.opsutil import live_worker, make_topics, wait_for, wait_ready, worker_config

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO / "out" / "dashboard.png"
CHARTS = ("throughput", "latency", "batch", "queue", "lag")

pytestmark = pytest.mark.skipif(find_chromium() is None, reason="chromium missing: run scripts/ensure_chromium.sh")

_POINTS_JS = (
    "Object.fromEntries([...document.querySelectorAll('figure.chart')]"
    ".map(f => [f.id, Number(f.dataset.points)]))"
)


def test_dashboard_charts_update_in_a_browser(broker, topic_factory, unique_group_id):
    topics = make_topics(topic_factory, 2)
    cfg = worker_config(broker, topics, unique_group_id)
    stop = threading.Event()
    with live_worker(cfg) as live:
        wait_ready(live.url)
        load = threading.Thread(
            target=produce, args=(broker.bootstrap_servers, "ctr", 60.0, 100_000),
            kwargs={"topic": topics.input, "profile": broker.profile, "should_stop": stop.is_set}, daemon=True,
        )
        load.start()
        try:
            with HeadlessChromium(live.url + "/?poll=500", width=1400, height=900) as browser:
                first = wait_for(lambda: _points(browser), 30, "the five charts to render")
                assert set(first) == {f"ctr-{c}" for c in CHARTS}
                # The window grows by one point per second on the server; the page
                # must pick the new points up without a reload.
                grown = wait_for(
                    lambda: (p := _points(browser)) and all(p[k] >= first[k] + 8 for k in first) and p,
                    60, "every chart to gain 8 data points",
                )
                assert int(browser.evaluate("document.body.dataset.polls")) >= 3
                assert browser.evaluate("document.getElementById('status').className") == "ok"
                # Requests flowed: the throughput and latency legends show numbers.
                wait_for(lambda: _kpi(browser, "throughput") not in ("", "– req/s", "0 req/s"), 30,
                         "a non-zero throughput figure")
                assert "/ 100 ms" in _kpi(browser, "p99 / SLO")
                assert browser.evaluate("document.getElementById('info').textContent").find("ready") >= 0
                SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                browser.screenshot(SCREENSHOT)
        finally:
            stop.set()
            load.join(timeout=30)
    assert SCREENSHOT.stat().st_size > 10_000, "the screenshot is suspiciously small"
    assert all(grown[k] > first[k] for k in first)


def _points(browser: HeadlessChromium) -> dict[str, int]:
    return browser.evaluate(_POINTS_JS) or {}


def _kpi(browser: HeadlessChromium, label: str) -> str:
    """The value text of the pipeline KPI box labelled `label` ('' if absent)."""
    js = (
        "(() => { const k = [...document.querySelectorAll('section.pipeline .kpi')]"
        f".find(k => k.querySelector('.label').textContent === {label!r});"
        " return k ? k.querySelector('.value').textContent : ''; })()"
    )
    return browser.evaluate(js) or ""
