"""Camera load schedule, codec options from the config, the text codec's pad_to switch."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from pipeline.codecs.text import TextCodec
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.loadgen.camera import camera_schedule, parse_resolutions, rate_at
from pipeline.registry.pipelines import get_pipeline


def test_camera_schedule_sends_fps_frames_per_camera_in_time_order() -> None:
    events = camera_schedule(cameras=3, fps=10.0, count=300, seed=1)
    times = [t for t, _, _ in events]
    assert times == sorted(times)
    per_camera = Counter(k for _, k, _ in events)
    assert set(per_camera.values()) == {100}
    for k in range(3):
        mine = [(t, j) for t, kk, j in events if kk == k]
        assert [j for _, j in mine] == list(range(100))  # frame ids count up
        gaps = np.diff([t for t, _ in mine])
        np.testing.assert_allclose(gaps, 0.1)  # a fixed frame rate


def test_camera_schedule_follows_the_day_night_wave() -> None:
    day = 100.0
    events = camera_schedule(cameras=1, fps=20.0, count=2000, day_seconds=day, seed=1)
    times = np.array([t for t, _, _ in events if t < day])
    night = np.sum((times < 10) | (times > 90))
    noon = np.sum((times > 40) & (times < 60))
    assert noon > 5 * night  # busy by day, quiet at night
    # The mean interval around noon is 1 / rate_at(noon).
    around = np.diff(times[(times > 49) & (times < 51)])
    assert around.mean() == pytest.approx(1.0 / rate_at(50.0, 20.0, day), rel=0.02)


def test_parse_resolutions() -> None:
    assert parse_resolutions("640x480, 320X240") == ((640, 480), (320, 240))
    for bad in ("", "640", "640x", "ax480", "0x10"):
        with pytest.raises(ValueError):
            parse_resolutions(bad)


def test_codec_options_reach_the_codec_and_a_typo_names_the_key() -> None:
    spec = get_pipeline("text")
    codec = spec.make_codec(load_config(overrides={"pipeline": "text", "codec": {"pad_to": "longest"}}, environ={}))
    assert codec.pad_to == "longest"
    env = {"TIDEBATCH_CODEC__PAD_TO": "longest"}
    assert spec.make_codec(load_config(overrides={"pipeline": "text"}, environ=env)).pad_to == "longest"
    with pytest.raises(UserError, match="codec.padto"):
        spec.make_codec(load_config(overrides={"codec": {"padto": "longest"}}, environ={}))
    with pytest.raises(UserError, match="pad_to"):
        spec.make_codec(load_config(overrides={"codec": {"pad_to": "max"}}, environ={}))
    camera = get_pipeline("camera").make_codec(load_config(overrides={"codec": {"max_bytes": 1000}}, environ={}))
    assert camera.max_bytes == 1000


def test_pad_to_longest_shares_one_bucket_and_pads_to_the_longest() -> None:
    codec = TextCodec(pad_to="longest")
    short = codec.decode(b'{"request_id": "a", "text": "hi there"}')
    long = codec.decode(b'{"request_id": "b", "text": "' + b"word " * 40 + b'"}')
    assert short.bucket == long.bucket
    feeds = codec.collate([short.payload, long.payload])
    assert feeds["input_ids"].shape == (2, len(long.payload))
    assert feeds["attention_mask"][0].sum() == len(short.payload)
    assert codec.padded_length([len(short.payload), len(long.payload)]) == len(long.payload)
    bucketed = TextCodec()
    assert bucketed.padded_length([5, 20]) == 32
