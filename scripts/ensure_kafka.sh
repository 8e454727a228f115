#!/usr/bin/env bash
# Make sure Apache Kafka's server jars (the version pinned in consumers/brokers/kafka_fetch.py) are
# in the local cache, so the integration tests can start real Kafka brokers without
# downloading anything. Fetched once with Maven from Maven Central into
# ~/.cache/tidebatch/kafka-<version>/libs ($TIDEBATCH_KAFKA_HOME overrides it);
# afterwards this is a no-op. Needs Java 17+; installs Debian's maven when mvn is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v java >/dev/null 2>&1; then
  echo "kafka: error: java not found on PATH; Apache Kafka needs Java 17 or newer (apt-get install openjdk-17-jre-headless)" >&2
  exit 1
fi
if ! command -v mvn >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "kafka: error: mvn not found on PATH and no apt-get here; install Maven 3" >&2
    exit 1
  fi
  echo "kafka: installing Maven (Debian package) to fetch the Kafka jars"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends maven >/dev/null
fi
# One line either way: where the jars are, or why they could not be fetched.
exec .venv/bin/python -m consumers.brokers.kafka fetch
