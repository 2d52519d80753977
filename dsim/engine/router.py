"""Cluster: N nodes x replicas per node, and the router that assigns arrivals to replicas.

A router answers one question: "which replica takes this request". Each router is one function
registered in ``ROUTES`` by ``@register_router(name)``; ``ROUTERS`` (the names, the ``--router``
choices and help text) is generated from it. The interface, for every router:

``route(router, rid, n) -> int``
    pre: ``n = len(router.replicas) >= 2`` (a fleet of one never asks); ``rid`` a request id of the
    workload; the function may read ``router.replicas[i].outstanding`` (running + waiting), the
    request's ``router.session_id[rid]`` (-1: none) and ``router.prefix_hashes[rid]``, and keep its
    own state on ``router`` (``_next``, ``_home``).
    post: an index in ``[0, n)``, deterministic for the same calls in the same order (ties go to
    the lowest index); no replica is touched (``Router.dispatch`` submits).

Routers:
- round_robin: in turn;
- least_outstanding: the replica with the fewest running + waiting requests (ties: lowest index);
- affinity: the same session (or, lacking one, the same first prefix block) goes to the same
  replica, so that its prefix cache hits; new keys go to the least outstanding replica.
"""

from __future__ import annotations

from collections.abc import Callable

RouteFn = Callable[["Router", int, int], int]
ROUTES: dict[str, RouteFn] = {}


def register_router(name: str) -> Callable[[RouteFn], RouteFn]:
    """Register ``fn`` as the router ``name`` (the interface in the module docstring)."""

    def add(fn: RouteFn) -> RouteFn:
        if name in ROUTES:
            raise ValueError(f"router {name!r} registered twice")
        ROUTES[name] = fn
        return fn

    return add


def _least(router: Router) -> int:
    out = [r.outstanding for r in router.replicas]
    return out.index(min(out))  # (the first of the fewest: ties go to the lowest index)


@register_router("round_robin")
def _round_robin(router: Router, rid: int, n: int) -> int:
    i = router._next
    router._next = (i + 1) % n
    return i


@register_router("least_outstanding")
def _least_outstanding(router: Router, rid: int, n: int) -> int:
    return _least(router)


@register_router("affinity")
def _affinity(router: Router, rid: int, n: int) -> int:
    key = None
    if router.session_id is not None and router.session_id[rid] >= 0:
        key = ("s", int(router.session_id[rid]))
    elif router.prefix_hashes is not None and len(router.prefix_hashes[rid]):
        key = ("p", int(router.prefix_hashes[rid][0]))
    if key is None:
        return _least(router)
    home = router._home.get(key)
    if home is None:
        home = router._home[key] = _least(router)
    return home


ROUTERS = tuple(ROUTES)  # the registered names, in registration order


class Router:
    def __init__(self, policy: str, replicas, session_id=None, prefix_hashes=None):
        if policy not in ROUTES:
            raise ValueError(f"unknown router {policy!r} (known: {', '.join(ROUTERS)})")
        self.policy = policy
        self._route = ROUTES[policy]
        self.replicas = replicas
        self.session_id = session_id
        self.prefix_hashes = prefix_hashes
        self._next = 0
        self._home: dict = {}

    def route(self, rid: int) -> int:
        n = len(self.replicas)
        if n == 1:
            return 0
        return self._route(self, rid, n)

    def dispatch(self, rid: int):
        self.replicas[self.route(rid)].submit(rid)

    def dispatch_many(self, rids) -> None:
        """dispatch(rid) for each of rids in turn (one replica: one submission of them all)."""
        if len(self.replicas) == 1:
            self.replicas[0].submit_many(rids)
            return
        for rid in rids:
            self.replicas[self.route(rid)].submit(rid)
