#!/usr/bin/env bash
# Make sure a Redis server answers on 127.0.0.1:6379 (the integration tests use it).
# Starts one when none answers; installs Debian's redis-server first if it is missing.
set -euo pipefail
ping_redis() {
  python3 - <<'PY'
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", 6379), timeout=1)
    s.sendall(b"PING\r\n")
    sys.exit(0 if s.recv(16).startswith(b"+PONG") else 1)
except OSError:
    sys.exit(1)
PY
}
if ping_redis; then
  echo "redis: answering on 127.0.0.1:6379"
  exit 0
fi
if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis: installing redis-server (Debian package)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
fi
mkdir -p /tmp/tidebatch-redis
redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
  --dir /tmp/tidebatch-redis --logfile /tmp/tidebatch-redis/redis.log
for _ in $(seq 1 50); do
  if ping_redis; then echo "redis: started on 127.0.0.1:6379"; exit 0; fi
  sleep 0.1
done
echo "redis: error: redis-server did not answer on 127.0.0.1:6379 (see /tmp/tidebatch-redis/redis.log)" >&2
exit 1
