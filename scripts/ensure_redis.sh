#!/usr/bin/env bash
# Make sure a Redis server answers on 127.0.0.1:6379 (the integration tests use it) and
# that the redis-server binary is installed (the Redis tests start private servers on
# free ports, to count commands exactly and to kill one mid-stream).
# Installs Debian's redis-server when the binary is missing; starts one on 6379 when
# nothing answers there.
set -euo pipefail
ping_redis() {
  python3 - <<'PY'
import socket, sys
try:
    s = socket.create_connection(("127.0.0.1", 6379), timeout=1)
    s.sendall(b"PING\r\n")
    reply = b""
    while b"\r\n" not in reply and len(reply) < 256:
        chunk = s.recv(256)
        if not chunk:
            break
        reply += chunk
    # +PONG, or -NOAUTH from a password-protected server: either way Redis answers
    sys.exit(0 if reply.startswith((b"+PONG", b"-NOAUTH")) else 1)
except OSError:
    sys.exit(1)
PY
}
install_redis_server() {
  echo "redis: installing redis-server (Debian package)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
}
if ! command -v redis-server >/dev/null 2>&1; then
  # Needed even when something answers on 6379: the private-server tests start their own.
  install_redis_server || echo "redis: warning: could not install redis-server; the tests that start private Redis servers will be skipped" >&2
fi
if ping_redis; then
  echo "redis: answering on 127.0.0.1:6379"
  exit 0
fi
if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis: error: nothing answers on 127.0.0.1:6379 and redis-server is not installed" >&2
  exit 1
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
