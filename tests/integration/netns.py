"""Network faults for the integration tests (issue 49, part 5): hosts in Linux network
namespaces joined by veth links, links cut and healed with `ip link set down/up`, and
degraded with `tc netem` where the kernel has it.

    with Network(["worker", "b1", "b2", "b3"]) as net:   # root joins as "root"
        KafkaBroker(nodes=3, hosts=[net.address(b) for b in ...], netns=[net.netns(b) ...])
        net.popen("worker", [...]); net.cut("worker", "b1"); ...; net.heal("worker", "b1")

Every pair of hosts, this (root) namespace included, has its own veth link, so one
pair can be cut while every other stays up. Each host has one address, 10.231.S.N/32
(on `lo` inside a namespace, on each of its link ends in the root namespace), reached
by a /32 route over the link to that host: the address a broker advertises is the
same for every client, whatever link carries it. S is picked per run among the
10.231.S.0/24 nobody here uses, under a file lock; namespace and link names carry a
per-run id, so parallel runs do not collide. close() (also on an exception, and at
exit) ends what runs inside and deletes the namespaces, which deletes their links;
namespaces left by a run that died (its pid is in their name) are deleted by the next.

Only addresses inside namespaces made here are used; nothing reaches any real network.
Needs root (CAP_NET_ADMIN) and iproute2: NetnsUnavailable says why not, with the error.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import itertools
import os
import re
import secrets
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = "root"
PREFIX = "tbnet"
SUBNET = ipaddress.ip_network("10.231.0.0/16")
ROOT_HOST_NUMBER = 254
_LOCK = Path("/tmp/tidebatch-netns.lock")
_NAME = re.compile(rf"^{PREFIX}-(\d+)-")


class NetnsUnavailable(RuntimeError):
    """Network namespaces or links cannot be made here; the message is the exact error."""


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `ip args` (in `netns` if given); a failure raises with ip's own error line."""
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    return _run(cmd, check)


def _run(cmd: list[str], check: bool) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    except FileNotFoundError as exc:
        raise NetnsUnavailable(f"{cmd[0]} not found: {exc.strerror}") from None
    if check and proc.returncode != 0:
        raise NetnsUnavailable(f"`{' '.join(cmd)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Delete the namespaces of runs whose process is gone (killed before close())."""
    listed = ip("netns", "list", check=False).stdout.split("\n")
    removed = []
    for line in listed:
        name = line.split(" ")[0]
        match = _NAME.match(name)
        if match and not _pid_alive(int(match.group(1))):
            _end_processes(name)
            ip("netns", "del", name, check=False)
            removed.append(name)
    return removed


def _end_processes(netns: str) -> None:
    """SIGKILL what still runs in `netns` (ours: the namespace is this run's)."""
    pids = ip("netns", "pids", netns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _subnet_in_use() -> set[int]:
    """Third octets of the 10.231.S.x addresses and routes this namespace has now."""
    text = ip("-o", "addr").stdout + ip("route").stdout
    return {int(m) for m in re.findall(r"\b10\.231\.(\d+)\.\d+", text)}


class Network:
    """Namespaces for `hosts` plus the root namespace ("root"), every pair linked."""

    def __init__(self, hosts: Sequence[str]) -> None:
        if ROOT in hosts or len(set(hosts)) != len(hosts) or not 0 < len(hosts) < ROOT_HOST_NUMBER:
            raise ValueError(f"hosts must be distinct names other than {ROOT!r}: {list(hosts)}")
        self.hosts = [ROOT, *hosts]
        self.run_id = ""
        self._netns: dict[str, str] = {}
        self._subnet: int | None = None
        # (a, b) -> (a's end, b's end), one entry per pair
        self._links: dict[tuple[str, str], tuple[str, str]] = {}
        self._procs: list[subprocess.Popen[Any]] = []
        self._closed = False

    # ------------------------------------------------------------------ set up
    def __enter__(self) -> Network:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> Network:
        """Make the namespaces, links, addresses and routes; NetnsUnavailable if it cannot.
        Once: `with Network(...).open() as net` is fine."""
        if self._subnet is not None:
            return self
        sweep_stale()
        atexit.register(self.close)
        try:
            with open(_LOCK, "w") as lock:
                # Two runs must not pick the same subnet or link names before either has made them.
                fcntl.flock(lock, fcntl.LOCK_EX)
                links = ip("-o", "link").stdout
                while not self.run_id or f"tb{self.run_id}" in links:
                    self.run_id = secrets.token_hex(2)
                self._netns = {h: f"{PREFIX}-{os.getpid()}-{self.run_id}-{h}" for h in self.hosts[1:]}
                used = _subnet_in_use()
                free = [s for s in range(1, 250) if s not in used]
                if not free:
                    raise NetnsUnavailable("no free 10.231.S.0/24 left")
                self._subnet = secrets.choice(free)
                for host in self.hosts[1:]:
                    ip("netns", "add", self._netns[host])
                    ip("link", "set", "lo", "up", netns=self._netns[host])
                    ip("addr", "add", f"{self.address(host)}/32", "dev", "lo", netns=self._netns[host])
                for i, j in itertools.combinations(range(len(self.hosts)), 2):
                    self._link(self.hosts[i], self.hosts[j], i, j)
        except BaseException:
            self.close()
            raise
        return self

    def _link(self, a: str, b: str, i: int, j: int) -> None:
        # Names are global in the root namespace: the run id keeps them apart (<= 15 chars).
        end_a, end_b = f"tb{self.run_id}{i:x}{j:x}", f"tb{self.run_id}{j:x}{i:x}"
        peer = ["netns", self._netns[b]]
        ip("link", "add", end_a, *self._in(a), "type", "veth", "peer", "name", end_b, *peer)
        self._links[(a, b)] = (end_a, end_b)
        if a == ROOT:
            # The root end carries root's address: a source the hosts route back to.
            ip("addr", "add", f"{self.address(ROOT)}/32", "dev", end_a)
        self._up(a, b)

    def _in(self, host: str) -> list[str]:
        return [] if host == ROOT else ["netns", self._netns[host]]

    def _ns(self, host: str) -> str | None:
        return None if host == ROOT else self._netns[host]

    def _ends(self, a: str, b: str) -> list[tuple[str, str, str]]:
        """[(host, its end, the host at the other end)] of the a-b link."""
        if (a, b) in self._links:
            ea, eb = self._links[(a, b)]
        elif (b, a) in self._links:
            eb, ea = self._links[(b, a)]
        else:
            raise KeyError(f"no link {a}-{b} (hosts: {self.hosts})")
        return [(a, ea, b), (b, eb, a)]

    def _up(self, a: str, b: str) -> None:
        for host, end, _ in self._ends(a, b):
            ip("link", "set", end, "up", netns=self._ns(host))
        # Routes over a link go with it when it goes down: set again on every heal.
        for host, end, other in self._ends(a, b):
            ip("route", "replace", f"{self.address(other)}/32", "dev", end, "src", self.address(host),
               netns=self._ns(host))

    # ------------------------------------------------------------------ use
    def address(self, host: str) -> str:
        """The host's one address (root's: what the hosts see of this namespace)."""
        if self._subnet is None:
            raise RuntimeError("Network is not open")
        number = ROOT_HOST_NUMBER if host == ROOT else self.hosts.index(host)
        return f"10.231.{self._subnet}.{number}"

    def netns(self, host: str) -> str:
        """The namespace name of a host (for `ip netns exec`)."""
        return self._netns[host]

    def prefix(self, host: str) -> list[str]:
        """The command prefix that runs a program in the host's namespace."""
        return [] if host == ROOT else ["ip", "netns", "exec", self._netns[host]]

    def popen(self, host: str, cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `cmd` in the host's namespace (ended by close() if still running)."""
        proc = subprocess.Popen([*self.prefix(host), *cmd], **kwargs)
        self._procs.append(proc)
        return proc

    def cut(self, a: str, b: str) -> None:
        """Take the a-b link down at both ends: nothing passes between them."""
        for host, end, _ in self._ends(a, b):
            ip("link", "set", end, "down", netns=self._ns(host))

    def heal(self, a: str, b: str) -> None:
        """Bring the a-b link back up, with its routes, and without any degradation."""
        self._up(a, b)

    def heal_everything(self) -> None:
        """Every link up, with its routes, and not degraded (between tests)."""
        for a, b in self._links:
            self.restore(a, b)
            self._up(a, b)

    def degrade(self, a: str, b: str, *, delay_ms: int, loss_pct: float) -> None:
        """netem delay and loss on both ends of the a-b link; NetnsUnavailable (with tc's
        error, e.g. "Specified qdisc kind is unknown." without sch_netem) if it cannot."""
        for host, end, _ in self._ends(a, b):
            _run([*self.prefix(host), "tc", "qdisc", "replace", "dev", end, "root", "netem",
                  "delay", f"{delay_ms}ms", "loss", f"{loss_pct:g}%"], check=True)

    def restore(self, a: str, b: str) -> None:
        """Remove the degradation of the a-b link."""
        for host, end, _ in self._ends(a, b):
            _run([*self.prefix(host), "tc", "qdisc", "del", "dev", end, "root"], check=False)

    def netem_error(self) -> str | None:
        """None if this kernel runs netem; else tc's exact error (tried on a spare link
        between two hosts, removed again)."""
        a, b = self.hosts[-2], self.hosts[-1]
        try:
            self.degrade(a, b, delay_ms=1, loss_pct=0)
        except NetnsUnavailable as exc:
            return str(exc)
        self.restore(a, b)
        return None

    # ------------------------------------------------------------------ tear down
    def close(self) -> None:
        """End what runs in the namespaces, delete them (and so their links). Twice is fine."""
        if self._closed:
            return
        self._closed = True
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for name in self._netns.values():
            _end_processes(name)
            ip("netns", "del", name, check=False)
        # A root end whose peer namespace was never made (a failed open).
        for end, _ in (ends for (a, _b), ends in self._links.items() if a == ROOT):
            ip("link", "del", end, check=False)
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
