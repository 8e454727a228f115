#!/usr/bin/env bash
# Make sure `prometheus` and `promtool` are installed (tests/integration/test_promtool.py
# and test_prometheus.py use them). Installs Debian's `prometheus` package when missing.
# The package's service is not needed: the tests start their own Prometheus.
set -euo pipefail
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  echo "prometheus: $(promtool --version 2>&1 | head -1)"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "prometheus: error: not installed and no apt-get here; install prometheus + promtool on PATH" >&2
  exit 1
fi
echo "prometheus: installing Debian's prometheus package (promtool included)"
export DEBIAN_FRONTEND=noninteractive
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
# policy-rc.d: do not start the packaged daemon (it would take port 9090).
NOSTART=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  NOSTART=1
fi
$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
if [ "$NOSTART" = 1 ]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi
echo "prometheus: $(promtool --version 2>&1 | head -1)"
