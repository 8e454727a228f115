#!/usr/bin/env bash
# Set everything up and run the whole test suite (unit + integration).
# The integration tests start the embedded Kafka broker themselves; Redis is started
# here when none answers on 127.0.0.1:6379.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/ensure_redis.sh
bash scripts/ensure_prometheus.sh   # promtool + prometheus for the ops tests
bash scripts/ensure_chromium.sh     # headless Chromium for the dashboard test
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q -ra "$@"
