"""Cluster: N nodes x replicas per node, and the router that assigns arrivals to replicas.

A router answers one question: "which replica takes this request". Policies:
- round_robin: in turn;
- least_outstanding: the replica with the fewest running + waiting requests (ties: lowest index);
- affinity: the same session (or, lacking one, the same first prefix block) goes to the same
  replica, so that its prefix cache hits; new keys go to the least outstanding replica.
"""

from __future__ import annotations

ROUTERS = ("round_robin", "least_outstanding", "affinity")


class Router:
    def __init__(self, policy: str, replicas, session_id=None, prefix_hashes=None):
        if policy not in ROUTERS:
            raise ValueError(f"unknown router {policy!r} (known: {', '.join(ROUTERS)})")
        self.policy = policy
        self.replicas = replicas
        self.session_id = session_id
        self.prefix_hashes = prefix_hashes
        self._next = 0
        self._home: dict = {}

    def _least(self):
        out = [r.outstanding for r in self.replicas]
        return out.index(min(out))  # (the first of the fewest: ties go to the lowest index)

    def route(self, rid: int) -> int:
        n = len(self.replicas)
        if n == 1:
            return 0
        if self.policy == "round_robin":
            i = self._next
            self._next = (i + 1) % n
            return i
        if self.policy == "least_outstanding":
            return self._least()
        key = None
        if self.session_id is not None and self.session_id[rid] >= 0:
            key = ("s", int(self.session_id[rid]))
        elif self.prefix_hashes is not None and len(self.prefix_hashes[rid]):
            key = ("p", int(self.prefix_hashes[rid][0]))
        if key is None:
            return self._least()
        home = self._home.get(key)
        if home is None:
            home = self._home[key] = self._least()
        return home

    def dispatch(self, rid: int):
        self.replicas[self.route(rid)].submit(rid)

    def dispatch_many(self, rids) -> None:
        """dispatch(rid) for each of rids in turn (one replica: one submission of them all)."""
        if len(self.replicas) == 1:
            self.replicas[0].submit_many(rids)
            return
        for rid in rids:
            self.replicas[self.route(rid)].submit(rid)
