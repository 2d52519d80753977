"""Other work on a local server's CPUs during a run.

The server's processes are the one listening on the URL's port and its descendants (vLLM: the API
server, the engine core, the workers); its engine CPUs are those its descendants may run on (the
listener's where it has none). Over a run, the busy time of those CPUs (/proc/stat) less the
server's own CPU time there (/proc/PID/stat, every thread) is other work: other processes, and the
measuring client where it shares them. A step that other work interrupts takes longer, and what
dsim predicts from a profile measured without it does not hold it: on the 2-core CPU test server,
a run at eight requests keeps the engine busy nearly all the time, so other work on its CPU comes
out of its steps, where at one or two requests it mostly fills the engine's idle gaps between
steps. `interference` measures it; compare.check names every run where it took more than
INTERFERENCE_SHARE of the engine CPUs' busy time (noise.interference_flags).

Linux only (/proc); a remote server, or one whose listener this user cannot see, gives None.
"""

from __future__ import annotations

import os
import time
from urllib.parse import urlsplit

LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1", "::", ""}
_TCP_LISTEN = "0A"


def _ticks() -> float:
    return float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def _listen_inodes(port: int) -> set[str]:
    """Inodes of the sockets listening on ``port`` (IPv4 and IPv6)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    if len(cols) > 9 and cols[3] == _TCP_LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        out.add(cols[9])
        except (OSError, ValueError):
            continue
    return out


def _pids() -> list[int]:
    try:
        return [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return []


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, utime + stime in clock ticks, every thread) of ``pid``; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[1]), float(rest[11]) + float(rest[12])
    except (OSError, IndexError, ValueError):
        return None


def _allowed(pid: int) -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(pid))
    except (OSError, AttributeError):
        return frozenset()


def server_pids(url: str) -> dict | None:
    """{"listener": pid, "descendants": [pid, ...]} of a local server at ``url``; None for a
    remote host, no listener found, or no /proc."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host not in LOCAL_HOSTS:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    inodes = {f"socket:[{i}]" for i in _listen_inodes(port)}
    if not inodes:
        return None
    owners, parent = [], {}
    for pid in _pids():
        st = _stat(pid)
        if st is not None:
            parent[pid] = st[0]
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    owners.append(pid)
                    break
            except OSError:
                continue
    if not owners:
        return None
    # the listener: the owner whose parent is not an owner (a forked worker shares the socket)
    root = min(owners, key=lambda p: (parent.get(p) in owners, p))
    kids, frontier = [], [root]
    while frontier:
        nxt = [p for p, pp in parent.items() if pp in frontier and p != root]
        kids += nxt
        frontier = nxt
    return {"listener": root, "descendants": sorted(kids)}


def snapshot(pids: dict | None) -> dict | None:
    """The server's processes' CPU times and allowed CPUs, every CPU's busy and idle ticks, this
    process's CPU time and the time; None without pids or /proc/stat."""
    if not pids:
        return None
    cpus = {}
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("cpu") and line[3:4].isdigit():
                    name, *v = line.split()
                    x = [float(t) for t in v] + [0.0] * 8
                    # busy: user, nice, system and steal (a hypervisor's other guests); interrupts
                    # left out (the loopback traffic of the server's own streams, about 9% of the
                    # API server's CPU on the test server); guest time is inside user
                    cpus[int(name[3:])] = (x[0] + x[1] + x[2] + x[7], x[3] + x[4])
    except (OSError, ValueError):
        return None
    procs = {}
    for pid in [pids["listener"], *pids["descendants"]]:
        st = _stat(pid)
        if st is not None:
            procs[pid] = (st[1], _allowed(pid))
    t = os.times()
    return {
        "t": time.monotonic(),
        "cpus": cpus,
        "procs": procs,
        "listener": pids["listener"],
        "self": (t.user + t.system, _allowed(0)),
    }


def _on(cpus: frozenset, before: dict, after: dict, procs: dict) -> dict:
    """Busy, idle, the server's and other work's seconds on ``cpus`` over the run."""
    hz = _ticks()
    busy = sum(after["cpus"][c][0] - before["cpus"][c][0] for c in cpus) / hz
    idle = sum(after["cpus"][c][1] - before["cpus"][c][1] for c in cpus) / hz
    # the server's processes that run only on these CPUs count as the server's work there
    own = sum((procs[p][0] - before["procs"][p][0]) / hz for p in procs if procs[p][1] and procs[p][1] <= cpus)
    client = 0.0
    if after["self"][1] and after["self"][1] <= cpus:
        client = max(after["self"][0] - before["self"][0], 0.0)
    others = max(busy - own, 0.0)
    return {
        "busy_s": round(busy, 3),
        "idle_s": round(idle, 3),
        "server_s": round(own, 3),
        "others_s": round(others, 3),
        "client_s": round(min(client, others), 3),
        "others_share": round(others / busy, 4) if busy > 0 else 0.0,
    }


def interference(before: dict | None, after: dict | None) -> dict | None:
    """Over a run (snapshot at its start and end): the engine CPUs, their busy seconds, the
    server's own seconds there, other work's seconds (``others_s``; the measuring client's part
    in ``client_s`` where it shares them) and ``others_share``, other work's part of those CPUs'
    busy time; where the listener (the API server) runs on other CPUs, the same for them in
    ``front``, other work besides the measuring client in ``front.others_share`` (what delays the
    API server's streams: the front end's time). None without both snapshots or engine CPUs."""
    if not before or not after:
        return None
    procs = {p: v for p, v in after["procs"].items() if p in before["procs"]}
    have = frozenset(c for c in after["cpus"] if c in before["cpus"])
    engine = [p for p in procs if p != after["listener"]] or list(procs)
    cpus = frozenset().union(*(procs[p][1] for p in engine)) & have if engine else frozenset()
    if not cpus:
        return None
    out = {"engine_cpus": sorted(cpus), "wall_s": round(after["t"] - before["t"], 4), **_on(cpus, before, after, procs)}
    lst = procs.get(after["listener"])
    front = (lst[1] & have) - cpus if lst else frozenset()
    if front:
        f = _on(front, before, after, procs)
        rest = max(f["others_s"] - f["client_s"], 0.0)
        f["others_share"] = round(rest / f["busy_s"], 4) if f["busy_s"] > 0 else 0.0
        out["front"] = {"cpus": sorted(front), **f}
    return out
