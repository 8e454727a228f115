#!/usr/bin/env bash
# Every GPU figure of issue 47 in one run, from the project root (docs/MODELS.md, "On a
# GPU host"): on the host after `bash .gpu/meta/install.sh`, or on any machine, where the
# CUDA rows say "skipped: no CUDA device" and the rest runs on CPU.
#   1. bench/gpu.py: the model alone per provider and mode, CPU vs CUDA diffs with TF32
#      off and on, CenterFace frames/s (step model); the CTR pipeline on CUDA
#      (bench/pipeline_capacity.py, step capacity);
#   2. the camera and text pipelines end to end on CUDA (bench/camera_text.py --quick);
#   3. the demo on CUDA, plain and with CUDA graphs, with its p99;
#   4. issue 46's scale-out (step scale): `run --processes N` with the CUDA model beside N
#      independent workers and a Kafka passthrough at the same N (bench/processes_scale.py),
#      CTR and CenterFace frames.
# Everything goes under $OUT (default out/gpu): one log per step, steps.txt (exit code
# and seconds of each), gpu.json, camera_text.json, the demos' summaries.
#   QUICK=1   fewer sizes, threads and requests (a run that fits a short device lease)
#   STEPS=... the steps to run, of model,capacity,camera_text,demo,scale (default all): a device
#             call runs at most 10 minutes, so the figures may take two calls
#   LOCK=...  a prefix for each heavy step (here: "flock /tmp/heavy.lock")
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
LOCK=${LOCK:-}
if [ "${QUICK:-0}" = 1 ]; then
  GPU_ARGS=(--sizes 1,8,64,512,4096,8192 --threads "1,$(nproc)" --seconds 0.15 --pipeline-requests 8000)
  DEMO_SECONDS=8
  SCALE_ARGS=(--processes 1,4,12 --requests 60000)
  CAMERA_ARGS=(--processes 1,4 --requests 4000)
else
  GPU_ARGS=()
  DEMO_SECONDS=15
  SCALE_ARGS=(--processes 1,2,4,8,12 --requests 200000)
  CAMERA_ARGS=(--processes 1,2,4,8 --requests 8000)
fi
STEPS=${STEPS:-model,capacity,camera_text,demo,scale}
wanted() { [[ ",$STEPS," == *",$1,"* ]]; }
failed=0
step() {  # step NAME COMMAND...: its output to $OUT/NAME.log, its exit code and seconds to steps.txt
  local name=$1; shift
  local t0; t0=$(date +%s)
  echo "== $name: $*"
  # shellcheck disable=SC2086  # LOCK is a command prefix, split on purpose
  $LOCK "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/steps.txt"
  [ "$rc" = 0 ] || failed=1
}
touch "$OUT/steps.txt"
{ date -u; uptime; nvidia-smi 2>&1 || echo "no nvidia-smi"; } > "$OUT/host.txt"
"$PY" -c "import onnxruntime as o; print(o.__version__, o.get_available_providers())" >> "$OUT/host.txt" 2>&1

wanted model && step gpu_bench "$PY" bench/gpu.py --no-pipeline --out "$OUT/gpu.json" "${GPU_ARGS[@]}"
wanted capacity && step gpu_capacity "$PY" bench/gpu.py --models "" --out "$OUT/gpu-capacity.json" "${GPU_ARGS[@]}"

export TIDEBATCH_RUNTIME__PROVIDERS=cuda  # where CUDA does not load, the session says so and runs on CPU
if wanted camera_text; then
  step camera_text "$PY" bench/camera_text.py --quick
  cp out/bench/camera_text.json "$OUT/" 2>/dev/null
  # which provider each pipeline's workers got (pipeline/runtime/session.py logs it at start)
  grep -h "loaded on provider\|CUDA graphs" out/bench/camera-*.log out/bench/text-*.log > "$OUT/pipeline_providers.txt" 2>/dev/null
fi

if wanted demo; then
  step demo_cuda "$PY" -m pipeline.cli demo --duration "$DEMO_SECONDS" --json --out "$OUT/demo-cuda"
  TIDEBATCH_RUNTIME__CUDA_GRAPHS=true \
    step demo_cuda_graphs "$PY" -m pipeline.cli demo --duration "$DEMO_SECONDS" --json --out "$OUT/demo-cuda-graphs"
  # one line per demo: provider, p99 (the summary's last line is the JSON)
  for d in demo_cuda demo_cuda_graphs; do
    tail -1 "$OUT/$d.log" | "$PY" -c "import json,sys; s=json.loads(sys.stdin.read()); print('$d', {k: s.get(k) for k in \
('provider', 'requests_scored', 'missing', 'scored_late', 'p50_ms', 'p99_ms', 'mean_batch_rows')})" \
      >> "$OUT/steps.txt" 2>/dev/null || echo "$d: no summary" >> "$OUT/steps.txt"
  done
fi
if wanted scale; then
  step scale_ctr "$PY" bench/processes_scale.py --provider cuda --producers 4 "${SCALE_ARGS[@]}" \
    --out "$OUT/processes_scale.json"
  step scale_camera "$PY" bench/processes_scale.py --provider cuda --producers 2 --pipeline camera \
    --cases processes,workers "${CAMERA_ARGS[@]}" --out "$OUT/processes_scale_camera.json"
fi
cat "$OUT/steps.txt"
exit "$failed"
