#!/usr/bin/env bash
# Make sure zsh and fish are installed: tests/unit/test_cli_completion.py runs
# `tidebatch completion zsh|fish` in the real shells and skips those cases without them.
# Installs Debian's packages when missing; when apt-get is not usable here (no apt, not
# root and no sudo, no network) it warns and goes on: only those cases are skipped.
set -euo pipefail
missing=()
for shell in zsh fish; do
  command -v "$shell" >/dev/null 2>&1 || missing+=("$shell")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "shells: zsh $(zsh --version | cut -d' ' -f2), $(fish --version)"
  exit 0
fi
install_shells() {
  command -v apt-get >/dev/null 2>&1 || { echo "no apt-get here" >&2; return 1; }
  export DEBIAN_FRONTEND=noninteractive
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
echo "shells: installing ${missing[*]} (Debian packages) for the completion tests"
if install_shells; then
  echo "shells: zsh $(zsh --version | cut -d' ' -f2), $(fish --version)"
else
  echo "shells: warning: could not install ${missing[*]}; their completion tests will be skipped" >&2
fi
