#!/usr/bin/env bash
# Make sure Apicurio Registry (the schema registry of the integration tests, through its
# Confluent-compatible API) is in the local cache, so the tests start it without
# downloading anything: its built distribution from Maven Central
# (io.apicurio:apicurio-registry-app, classifier `all`), unpacked with Maven into
# ~/.cache/tidebatch/apicurio-<version>/dist ($TIDEBATCH_APICURIO_HOME overrides it), then
# started once to write its class-data archive (faster starts after). Afterwards a
# no-op. Needs Java 17+ and Maven, as scripts/ensure_kafka.sh does (which installs
# Maven, so scripts/test.sh runs it first). docs/SCHEMA_REGISTRY.md.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mvn >/dev/null 2>&1; then
  echo "registry: error: mvn not found on PATH; scripts/ensure_kafka.sh installs it (or apt-get install maven)" >&2
  exit 1
fi
# One line either way: where the registry is, or why it could not be fetched or started.
exec .venv/bin/python -m tests.integration.schema_registry fetch
