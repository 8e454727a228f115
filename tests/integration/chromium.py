"""Headless Chromium driven over the DevTools protocol (CDP), with the standard library
only: a minimal WebSocket client (RFC 6455, client side, text frames) is all CDP
needs, so the browser tests add no Python dependency.

    with HeadlessChromium(url) as browser:
        browser.evaluate("document.title")
        browser.screenshot(Path("out/page.png"))

The browser is Debian's `chromium` (scripts/ensure_chromium.sh installs it).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
)


def find_chromium() -> str | None:
    """The Chromium binary: $CHROMIUM, else the real binary behind Debian's launcher
    script (the script only adds flags we set ourselves), else what PATH has."""
    env = os.environ.get("CHROMIUM")
    if env:
        return env
    for path in ("/usr/lib/chromium/chromium",):
        if os.access(path, os.X_OK):
            return path
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class CdpError(RuntimeError):
    pass


class _WebSocket:
    """Just enough RFC 6455 for CDP: masked client text frames, unmasked server frames
    (text, continuation, ping, close), any payload length."""

    def __init__(self, url: str, timeout: float) -> None:
        assert url.startswith("ws://")
        hostport, _, path = url[len("ws://"):].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        # No Origin header: Chromium only checks the origin of requests that send one.
        request = (
            f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise CdpError("websocket handshake: connection closed")
            head += chunk
        status, _, rest = head.partition(b"\r\n\r\n")
        if b" 101 " not in status.split(b"\r\n", 1)[0]:
            raise CdpError(f"websocket handshake refused: {status.decode(errors='replace')}")
        self._buf = rest

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise CdpError("websocket closed by the browser")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def send(self, text: str) -> None:
        payload = text.encode()
        header = bytearray([0x81])  # FIN + text
        n = len(payload)
        if n < 126:
            header.append(0x80 | n)
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(bytes(header) + mask + masked)

    def recv(self) -> str:
        parts: list[bytes] = []
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", self._read(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", self._read(8))
            mask = self._read(4) if b1 & 0x80 else None
            data = self._read(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            if opcode == 0x8:
                raise CdpError("websocket closed by the browser")
            if opcode in (0x9, 0xA):  # ping/pong: Chromium's CDP server sends none
                continue
            parts.append(data)
            if b0 & 0x80:
                return b"".join(parts).decode()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class HeadlessChromium:
    """A headless Chromium showing `url`, with CDP on a port Chromium picks itself
    (--remote-debugging-port=0; the port is read from DevToolsActivePort)."""

    def __init__(self, url: str, *, width: int = 1400, height: int = 1000, timeout: float = 30.0) -> None:
        binary = find_chromium()
        if binary is None:
            raise CdpError("chromium not found: run scripts/ensure_chromium.sh")
        self.url = url
        self.timeout = timeout
        self.profile = Path(tempfile.mkdtemp(prefix="tidebatch-chromium-"))
        # Next to the profile, not in it: the profile is removed on close, the log kept.
        self.log_path = self.profile.with_name(self.profile.name + ".log")
        cmd = [
            binary, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
            f"--window-size={width},{height}", url,
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._ws: _WebSocket | None = None
        self._next_id = 0

    def __enter__(self) -> HeadlessChromium:
        try:
            self._ws = _WebSocket(self._page_ws_url(), self.timeout)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _page_ws_url(self) -> str:
        deadline = time.monotonic() + self.timeout
        port_file = self.profile / "DevToolsActivePort"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise CdpError(f"chromium exited with {self.proc.returncode}; see {self.log_path}")
            if port_file.is_file():
                lines = port_file.read_text().split()
                if lines:
                    with contextlib.suppress(OSError, ValueError):
                        with urllib.request.urlopen(f"http://127.0.0.1:{lines[0]}/json/list", timeout=2) as r:
                            pages = [t for t in json.load(r) if t.get("type") == "page"]
                        if pages:
                            return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.1)
        raise CdpError(f"chromium did not open DevTools within {self.timeout:g} s; see {self.log_path}")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        assert self._ws is not None, "use HeadlessChromium as a context manager"
        self._next_id += 1
        my_id = self._next_id
        self._ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:  # skip events until our answer arrives
            msg = json.loads(self._ws.recv())
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise CdpError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise CdpError(f"{expression!r} raised: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
