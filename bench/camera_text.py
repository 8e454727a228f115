"""Camera and text pipelines side by side, in one run on this machine.

Camera (CenterFace, 320x240 frames -> the 320x256 bucket, K cameras keyed by camera id
at a fixed frame rate each), per policy none / static / adaptive:
  - throughput: a burst of frames drained by the worker (frames/s, from the first
    frame's consumption to the last result),
  - p50/p99 end-to-end latency (result timestamp - frame's Kafka timestamp) at two
    loads, as fractions of the model's single-frame capacity measured at start.
  On CPU a convolutional model gains nothing from batching (t(n) ~ b*n): the question
  is whether a policy ADDS latency there.

Text (MiniLM, the generator's mixed lengths: 70 % chat lines, 20 % medium, 10 % long
reviews), three variants on the same load:
  - bucketed: adaptive policy, padding to the length bucket's edge (the default),
  - longest:  adaptive policy, codec pad_to=longest (one bucket, each batch padded to
              its longest request: the usual approach without buckets),
  - bucketed-greedy / longest-greedy: the same two paddings under greedy batching
              (whatever is queued, up to the max), where batches always form,
  - none:     no batching.
  Each: backlog drain throughput, p50/p99 at one open-loop load, and the padded-token
  ratio (share of token slots that are padding, from the result documents: the requests
  of one batch share batch_rows, inference_ms and scored_at_ms).

Every worker is a `tidebatch run --pipeline camera|text` process; the variants' workers
run side by side (each on its own topics) and the open-loop traffic goes to one at a
time, in slices of --slice-seconds, the order rotated every round, so the machine's
other tenants weigh on every variant alike. Budgets are generous
(--slo-ms, default 60000; the text requests' own deadline_ms is dropped, their priority
kept) so that the comparison is about batching and padding, not about deadline
handling: nothing goes to the adaptive policy's late lane. Loads are shares of the
model's own speed measured at start (best of a few runs); on a shared 2-core machine
the worker's model time per row (reported) can be much higher, which is the load the
run really saw.

    .venv/bin/python bench/camera_text.py [--slice-seconds 5] [--rounds 3] [--only camera|text] [--quick]

Prints tables and writes out/bench/camera_text.json. Its parts:
bench/camera_text_variants.py (the workers side by side, summaries),
bench/camera_text_camera.py and bench/camera_text_text.py (the two halves).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.camera_text_camera import bench_camera, print_camera  # noqa: E402
from bench.camera_text_text import bench_text, print_text  # noqa: E402
from bench.harness import OUT, embedded_broker  # noqa: E402


def print_tables(cam: dict | None, text: dict | None, slo_ms: float) -> None:
    if cam is not None:
        print_camera(cam, slo_ms)
    if text is not None:
        print_text(text, slo_ms)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slice-seconds", type=float, default=5.0, help="open-loop seconds of one variant's slice")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of slices (variants rotated) per load")
    ap.add_argument("--camera-loads", default="0.25,0.5", help="shares of the model's capacity")
    ap.add_argument("--text-load", type=float, default=0.4, help="share of one-at-a-time capacity")
    ap.add_argument("--slo-ms", type=float, default=60000.0)
    ap.add_argument("--camera-drain", type=int, default=120, help="backlog frames drained per policy")
    ap.add_argument("--text-drain", type=int, default=160, help="backlog requests drained per variant")
    ap.add_argument("--only", choices=("camera", "text"), help="run one half")
    ap.add_argument("--quick", action="store_true", help="short runs, to check the script works")
    args = ap.parse_args()
    if args.quick:
        args.slice_seconds, args.rounds = 2.0, 1
        args.camera_drain, args.text_drain = 20, 30
    loads = tuple(float(x) for x in args.camera_loads.split(","))
    with embedded_broker() as broker:
        cam = text = None
        if args.only != "text":
            cam = bench_camera(broker.bootstrap_servers, args.slice_seconds, args.rounds, args.slo_ms, loads,
                               args.camera_drain)
        if args.only != "camera":
            text = bench_text(broker.bootstrap_servers, args.slice_seconds, args.rounds, args.slo_ms, args.text_load,
                              args.text_drain)
    report = {"camera": cam, "text": text, "slo_ms": args.slo_ms, "cpu_count": os.cpu_count()}
    print_tables(cam, text, args.slo_ms)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "camera_text.json").write_text(json.dumps(report, indent=2))
    print(f"\nwrote {OUT / 'camera_text.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
