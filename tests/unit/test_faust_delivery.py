"""The Faust example app's processing_guarantee comes from tidebatch's `delivery` value
(TIDEBATCH_FAUST_DELIVERY); exactly_once is refused with one line, for the embedded
broker and for Faust's own transactions (examples/faust_ctr/README.md, "Exactly-once")."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from pipeline.config.kafka_keys import DELIVERY_MODES
from pipeline.faust.app import (
    EMBEDDED_NO_EXACTLY_ONCE,
    FAUST_NO_EXACTLY_ONCE,
    PROCESSING_GUARANTEE,
    processing_guarantee,
)

APP = Path(__file__).resolve().parents[2] / "examples" / "faust_ctr" / "app.py"


def test_every_delivery_mode_has_a_faust_processing_guarantee() -> None:
    assert set(PROCESSING_GUARANTEE) == set(DELIVERY_MODES)
    enums = pytest.importorskip("faust.types.enums", reason="faust-streaming is not installed")
    for value in PROCESSING_GUARANTEE.values():
        enums.ProcessingGuarantee(value)  # Faust accepts it


@pytest.mark.parametrize("profile", ["kafka", "embedded"])
def test_at_least_once_maps_to_faust_at_least_once(profile: str) -> None:
    assert processing_guarantee("at_least_once", profile) == "at_least_once"


def test_exactly_once_on_the_embedded_broker_is_one_line_about_tansu() -> None:
    with pytest.raises(ValueError) as err:
        processing_guarantee("exactly_once", "embedded")
    assert str(err.value) == EMBEDDED_NO_EXACTLY_ONCE
    assert "\n" not in str(err.value)
    assert "Tansu" in str(err.value) and "aborted transactions" in str(err.value)


def test_exactly_once_on_kafka_is_one_line_about_faust_transactions() -> None:
    with pytest.raises(ValueError) as err:
        processing_guarantee("exactly_once", "kafka")
    assert str(err.value) == FAUST_NO_EXACTLY_ONCE
    assert "\n" not in str(err.value)
    assert "outside its transactions" in str(err.value)
    assert "tidebatch run --delivery exactly_once" in str(err.value)


def test_an_unknown_delivery_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="at_least_once, exactly_once"):
        processing_guarantee("at_most_once", "kafka")


# ----------------------------------------------------------------------------- the app
def run_app(monkeypatch: pytest.MonkeyPatch, **env: str) -> dict:
    pytest.importorskip("faust", reason="faust-streaming is not installed (the [faust] extra)")
    for name, value in env.items():
        monkeypatch.setenv(f"TIDEBATCH_FAUST_{name}", value)
    return runpy.run_path(str(APP))


@pytest.mark.parametrize(
    ("profile", "line"), [("embedded", EMBEDDED_NO_EXACTLY_ONCE), ("kafka", FAUST_NO_EXACTLY_ONCE)]
)
def test_the_example_app_refuses_exactly_once_with_one_line(
    monkeypatch: pytest.MonkeyPatch, profile: str, line: str
) -> None:
    with pytest.raises(SystemExit) as stop:
        run_app(monkeypatch, DELIVERY="exactly_once", BROKER_PROFILE=profile)
    assert stop.value.code == line  # printed as the exit message, no traceback


def test_the_example_app_sets_processing_guarantee_from_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    from faust.types.enums import ProcessingGuarantee

    default = run_app(monkeypatch)
    assert default["app"].conf.processing_guarantee == ProcessingGuarantee.AT_LEAST_ONCE
    explicit = run_app(monkeypatch, DELIVERY="at_least_once", BROKER_PROFILE="embedded")
    assert explicit["app"].conf.processing_guarantee == ProcessingGuarantee.AT_LEAST_ONCE


def test_the_example_app_refuses_an_unknown_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit, match="TIDEBATCH_FAUST_DELIVERY='maybe'"):
        run_app(monkeypatch, DELIVERY="maybe")
