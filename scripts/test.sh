#!/usr/bin/env bash
# Set everything up and run the whole test suite (unit + integration).
# The integration tests start their Kafka brokers themselves (embedded Tansu, and Apache
# Kafka from jars fetched here once), and their schema registry (Apicurio, fetched here
# once); Redis is started here when none answers on 127.0.0.1:6379.
# pytest runs on TIDEBATCH_TEST_WORKERS xdist workers (default 3; 0: no xdist, one
# process), each test module whole on one worker and the fault tests one after the
# other on one (tests/conftest.py). Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/ensure_redis.sh
bash scripts/ensure_kafka.sh        # Apache Kafka jars from Maven Central (cached after once)
bash scripts/ensure_registry.sh     # Apicurio Registry from Maven Central, the tests' schema registry (cached after once)
bash scripts/ensure_prometheus.sh   # promtool + prometheus for the ops tests
bash scripts/ensure_chromium.sh     # headless Chromium for the dashboard test
bash scripts/ensure_shells.sh       # zsh and fish for the completion tests (skipped without)
bash scripts/ensure_peers.sh        # .venv-peers for the quixstreams/Bytewax bench rows (skipped without)
.venv/bin/ruff check .
workers="${TIDEBATCH_TEST_WORKERS:-3}"
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadgroup)
exec .venv/bin/python -m pytest -q -ra "${parallel[@]}" "$@"
