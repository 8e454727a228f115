#!/usr/bin/env bash
# Make sure .venv-peers exists (bench/peers/setup.sh): tests/integration/test_peers_bench.py
# runs the quixstreams and Bytewax rows of bench/peers.py with it and skips them without.
# A second run only checks that it imports. When it cannot be made here (no network,
# no Python 3.11) it warns and goes on: only that test is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
check() { .venv-peers/bin/python -c "import quixstreams, bytewax, onnxruntime" >/dev/null 2>&1; }
if [ -x .venv-peers/bin/python ] && check; then
  echo "peers: .venv-peers ready (quixstreams, Bytewax)"
  exit 0
fi
echo "peers: making .venv-peers for the quixstreams and Bytewax bench rows (bench/peers/setup.sh)"
if bash bench/peers/setup.sh >/dev/null 2>&1 && check; then
  echo "peers: .venv-peers ready (quixstreams, Bytewax)"
else
  echo "peers: warning: could not make .venv-peers (run bench/peers/setup.sh to see why); test_quixstreams_and_bytewax_rows will be skipped" >&2
fi
