#!/usr/bin/env bash
# Make sure headless Chromium is installed (tests/integration/test_dashboard.py drives
# it over the DevTools protocol). Installs Debian's `chromium` package when missing.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || [ -x /usr/lib/chromium/chromium ]; then
  echo "chromium: $(chromium --version 2>/dev/null || /usr/lib/chromium/chromium --version)"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium: error: not installed and no apt-get here; install Chromium and set CHROMIUM=/path/to/it" >&2
  exit 1
fi
echo "chromium: installing Debian's chromium package"
export DEBIAN_FRONTEND=noninteractive
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
echo "chromium: $(chromium --version 2>/dev/null)"
