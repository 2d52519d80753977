"""Capacity planning: the fewest nodes that meet an SLA, per speculative method.

``plan(workloads, profile, specs, slos, ...)`` -> {method: {...}, "assumptions": {...}}, the SLA terms
(:class:`dsim.study.sla.SLO`) from dsim.study.sla.parse_sla.

Load model: the workload's arrival process is fixed (an open-loop trace); N nodes share it
through the router. A node count passes when, for *every* seed, every SLO metric is within
target x (1 - margin) (a minimum per-user speed must reach target / (1 - margin)) and every
request completed; the reported metrics are the worst over the seeds.

Search, per method: exponential (1, 2, 4, ... capped at max_nodes, optionally starting from a
hint) until a count passes, then bisection between the last failing and the first passing count.
A node count is first simulated with the first seed only; the other seeds run only if it passes
(a failing seed decides "fails" whatever the others say, so the answer does not depend on the
order, on the number of worker processes or on the executor). Simulations run in a process pool
(``jobs``) or as Ray tasks (``executor="ray"``, dsim.study.executor).
"""

from __future__ import annotations

import dataclasses
import math
import os
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dsim.engine.metrics import weighted_percentile
from dsim.errors import InputError
from dsim.outputs import field_lines
from dsim.study.sla import SLO

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from concurrent.futures import Future

    import pandas as pd

    from dsim.spec.runtime import SpecConfig


# ---- one simulation (runs in a worker process) ----------------------------------------------


@dataclass(frozen=True)
class Point:
    """Everything one simulation needs; picklable."""

    workload: object
    profile: object
    spec: object
    nodes: int
    seed: int
    gpus_per_node: int = 8
    router: str = "least_outstanding"
    engine: object = None
    tag: object = None  # caller's label, returned unchanged


def metric_values(summary: dict, req: pd.DataFrame, slos: Iterable[SLO], itl: Any = None) -> dict:
    """Each SLO's measured value from a simulation (request table and the ITL samples
    (values, counts) for arbitrary percentiles)."""
    done = req[req["completed"]]
    out = {}
    for s in slos:
        if s.metric == "min_user_tok_s":
            out[s.key] = summary.get("output_tok_s_per_user")
        elif s.metric == "itl":
            out[s.key] = (
                weighted_percentile(itl[0], itl[1], s.pct) if itl is not None else summary["itl_ms"].get(f"p{s.pct:g}")
            )
        else:
            col = done[f"{s.metric}_ms"].dropna().to_numpy()
            out[s.key] = float(np.percentile(col, s.pct)) if len(col) else None
    return out


def run_point(p: Point, slos: Iterable[SLO] = (), keep: tuple = ()) -> dict:
    """Simulate one point; return a small picklable dict: the summary, the SLO metric values and,
    for each column named in `keep`, that column of the completed requests as a numpy array."""
    from dsim.engine.config import EngineConfig
    from dsim.sim import SimConfig, simulate

    cfg = SimConfig(
        workload=p.workload,
        profile=p.profile,
        nodes=p.nodes,
        gpus_per_node=p.gpus_per_node,
        router=p.router,
        engine=p.engine or EngineConfig(),
        spec=p.spec,
        seed=p.seed,
        keep_steps=False,  # (never read here: the summary counts the steps without the table)
    )
    res = simulate(cfg)
    s = res.summary
    out = {
        "tag": p.tag,
        "nodes": p.nodes,
        "seed": p.seed,
        "summary": s,
        "metrics": metric_values(s, res.requests, slos, res.itl),
        "complete": s["requests_completed"] == s["requests_total"],
    }
    if keep:
        done = res.requests[res.requests["completed"]]
        out["columns"] = {c: done[c].to_numpy() for c in keep}
    return out


# The first requests of a workload that a warm-up simulates: enough for decode windows, arrivals
# cutting them and general steps with decodes, so that every kernel a full run calls is loaded.
WARM_REQUESTS = 64


def warm_kernels(points: Iterable[Point]) -> None:
    """Load the compiled step kernels that these points' simulations call (numba's on-disk cache:
    about 0.8 s of CPU in a fresh process) by simulating the first WARM_REQUESTS requests of each,
    so that worker processes forked afterwards start with them loaded rather than each loading
    them again. Nothing of these simulations is kept."""
    for p in points:
        run_point(dataclasses.replace(p, workload=p.workload.head(min(WARM_REQUESTS, len(p.workload)))))


class Runner:
    """Runs Points through an executor (dsim.study.executor): local processes (serial when jobs=1) or
    Ray tasks. Results never depend on the executor or on `jobs`. A `progress` (dsim.study.progress)
    counts every submitted call and its completion. `warm` (a callable, e.g. warm_kernels of the
    points to come) runs before a local pool of several workers starts, where the workers are
    forked (they inherit what it loaded); elsewhere each process loads the kernels on first use."""

    def __init__(
        self,
        jobs: int | None = None,
        executor: str = "local",
        address: str | None = None,
        progress=None,
        warm: Callable[[], Any] | None = None,
    ):
        self.jobs = max(1, int(jobs or os.cpu_count() or 1))
        self.kind = executor
        self.address = address
        self.progress = progress
        self.warm = warm
        self.claim = None  # the progress key that submissions were declared under (ahead)
        self.executor = None

    def __enter__(self):
        import multiprocessing

        from dsim.study.executor import make_executor

        forked = self.kind == "local" and self.jobs > 1 and multiprocessing.get_start_method() == "fork"
        if self.warm is not None and forked:
            self.warm()
        self.executor = make_executor(self.kind, self.jobs, self.address)
        return self

    def __exit__(self, exc_type, *exc):
        # after an error or Ctrl-C: cancel what has not run yet (Ray: cancel the tasks, then shut down)
        if self.executor is not None:
            self.executor.close(cancel=exc_type is not None)
            self.executor = None
        return False

    def submit(self, fn: Callable[..., Any], *a: Any, **kw: Any) -> Future:
        f = self.executor.submit(fn, *a, **kw)
        return f if self.progress is None else self.progress.track(f, self.claim)

    def map(self, fn: Callable[..., Any], items: Iterable[Any], **kw: Any) -> list:
        """[fn(x, **kw) for x in items], in order, in parallel."""
        items = list(items)
        own = self.progress is not None and self.claim is None
        if own:  # the whole batch counts towards the bar's total from the start
            self.progress.ahead(map=len(items))
            self.claim = "map"
        try:
            futs = [self.submit(fn, x, **kw) for x in items]
        finally:
            if own:
                self.claim = None
        return [f.result() for f in futs]


# ---- the search -----------------------------------------------------------------------------


def _passes(r: dict, slos, margin: float) -> bool:
    return r["complete"] and all(s.ok(r["metrics"].get(s.key), margin) for s in slos)


class _Search:
    """Exponential then bisection search over node counts for one method, driven by results.

    `want()` says which (nodes, seed) simulations it needs next; `feed()` gives it one result.
    """

    def __init__(self, name, seeds, slos, margin, max_nodes, start=1):
        self.name, self.seeds, self.slos, self.margin = name, list(seeds), slos, margin
        self.max_nodes = max_nodes
        self.results: dict = {}  # (nodes, seed) -> result
        self.verdict: dict = {}  # nodes -> bool
        self.lo = 0  # largest count known to fail
        self.hi = None  # smallest count known to pass
        self.cur = min(max(1, int(start)), max_nodes)
        self.trail: list = []  # (nodes, passed) in the order decided
        self.done = False
        self.best_effort_pending = False

    def _decide(self, n: int):
        """Verdict for n if enough seeds are in: a failing seed fails it, all passing seeds pass it."""
        got = [self.results.get((n, s)) for s in self.seeds]
        for r in got:
            if r is not None and not _passes(r, self.slos, self.margin):
                return False
        if all(r is not None for r in got):
            return True
        return None

    def want(self) -> list:
        if self.done:
            if self.best_effort_pending:  # unmeetable: every seed at max_nodes, for the report
                return [(self.max_nodes, s) for s in self.seeds if (self.max_nodes, s) not in self.results]
            return []
        n = self.cur
        first = (n, self.seeds[0])
        if first not in self.results:
            return [first]
        if _passes(self.results[first], self.slos, self.margin):
            return [(n, s) for s in self.seeds[1:] if (n, s) not in self.results]
        return []

    def feed(self, n: int, seed: int, r: dict) -> None:
        self.results[(n, seed)] = r
        if self.done or n != self.cur:
            return
        v = self._decide(n)
        if v is None:
            return
        self.verdict[n] = v
        self.trail.append((n, v))
        if v:
            self.hi = n
        else:
            self.lo = n
        if self.hi is None:  # exponential phase, upwards
            if n >= self.max_nodes:
                self.done = True
                self.best_effort_pending = True
                return
            self.cur = min(2 * n, self.max_nodes)
        elif self.lo == 0:  # passed from a start hint: halve downwards
            if self.hi == 1:
                self.done = True
            else:
                self.cur = max(1, self.hi // 2)
        elif self.hi - self.lo <= 1:
            self.done = True
        else:  # bisection
            self.cur = (self.lo + self.hi) // 2

    def remaining(self) -> int:
        """At most how many simulations not yet in `results` this search may still ask for (for the
        progress bar's total): the current count's missing seeds, then every count the exponential
        and bisection phases could still visit, each with every seed."""
        ns = len(self.seeds)
        if self.done:
            return len(self.want())
        left = sum((self.cur, s) not in self.results for s in self.seeds)
        if self.hi is None:
            # the current count passes: halving down (nothing failed yet) or bisecting below it;
            # it fails: doubling up to max_nodes, then bisecting one gap (at most max_nodes / 2)
            ups, n = 0, self.cur
            while n < self.max_nodes:
                n = min(2 * n, self.max_nodes)
                ups += 1
            below = 2 * math.ceil(math.log2(self.cur)) if self.lo == 0 else math.ceil(math.log2(self.cur - self.lo))
            counts = max(below, ups + math.ceil(math.log2(max(1, self.max_nodes // 2))))
            best_effort = ns - 1  # max_nodes failed on its first seed: the rest
        elif self.lo == 0:  # halving down from a start hint, then bisecting
            counts = 2 * math.ceil(math.log2(max(1, self.hi)))
            best_effort = 0
        else:
            counts = max(0, math.ceil(math.log2(self.hi - self.lo)) - 1)
            best_effort = 0
        return left + counts * ns + best_effort

    def describe(self) -> str:
        """The search's state in a few words: the count being tried, or the answer."""
        if self.done:
            return f"{self.name} {self.hi} node(s)" if self.hi is not None else f"{self.name} not met"
        return f"{self.name} trying {self.cur} node(s)"

    def outcome(self) -> dict:
        met = self.hi is not None
        n = self.hi if met else self.max_nodes
        rs = [self.results[(n, s)] for s in self.seeds if (n, s) in self.results]
        return {"met": met, "nodes": n, "results": rs, "trail": self.trail}


def search_nodes(
    points_for: Callable[..., Point],
    searches: dict,
    runner: Runner,
    slos: Iterable[SLO],
    progress: Callable[..., Any] | None = None,
) -> dict:
    """Drive several _Search objects at once over one runner. points_for(name, nodes, seed) -> Point.
    `progress`: a callable (name, nodes, seed, result) called per result; the runner's progress
    bar (if any) gets the searches' remaining work and their current node counts."""
    pending = {}
    bar = runner.progress
    if bar is not None:  # declared before the first submissions, so the total never dips
        bar.ahead(search=sum(srch.remaining() for srch in searches.values()))
    while True:
        for name, srch in searches.items():
            for n, s in srch.want():
                if (name, n, s) not in pending.values():
                    f = runner.submit(run_point, points_for(name, n, s), slos)
                    pending[f] = (name, n, s)
        if bar is not None:
            bar.ahead(
                search=sum(
                    max(0, srch.remaining() - sum(1 for (m, n, _s) in pending.values() if m == name and n == srch.cur))
                    for name, srch in searches.items()
                )
            )
            bar.note(", ".join(srch.describe() for srch in searches.values()))
        if not pending:
            break
        done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
        # feed in a fixed order so the (deterministic) decisions never depend on timing
        for f in sorted(done, key=lambda f: pending[f]):
            name, n, s = pending.pop(f)
            searches[name].feed(n, s, f.result())
            if progress:
                progress(name, n, s, f.result())
    return {name: srch.outcome() for name, srch in searches.items()}


# ---- the plan -------------------------------------------------------------------------------


def method_label(spec: SpecConfig) -> str:
    if spec.method == "mtp":
        return f"MTP-{spec.k or 1}"
    if spec.method == "dspark":
        block = f"DSpark-{spec.k}" if spec.k else "DSpark"  # (no k: the default block of 7)
        return f"{block} adaptive" if spec.adaptive else f"{block} fixed"
    if spec.method == "block" and spec.k:
        return f"block drafter K={spec.k}"
    return {"none": "no speculation", "eagle3": "EAGLE-3", "block": "block drafter"}.get(spec.method, spec.method)


def _worst(slo: SLO, vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    return min(vals) if slo.is_min else max(vals)


def summarize_method(
    name: str,
    spec: SpecConfig,
    out: dict,
    slos: Iterable[SLO],
    margin: float,
    gpus_per_node: int,
    price: float | None,
    spot_price: float | None,
) -> dict:
    rs = out["results"]
    nodes = out["nodes"]
    gpus = nodes * gpus_per_node
    metrics = {}
    for s in slos:
        vals = [r["metrics"].get(s.key) for r in rs]
        metrics[s.key] = {
            "value": _worst(s, vals),
            "target": s.target,
            "limit": round(s.limit(margin), 4),
            "unit": s.unit,
            "ok": s.ok(_worst(s, vals), margin),
            "seeds": {int(r["seed"]): v for r, v in zip(rs, vals)},
            "describe": s.describe(),
        }
    tok_s = float(np.mean([r["summary"]["output_tok_s"] for r in rs])) if rs else 0.0
    # no price (a GPU kind with no public quote and none given): no dollar figure at all
    cost_h = gpus * price if price is not None else None
    per_m = cost_h / (tok_s * 3600) * 1e6 if cost_h is not None and tok_s > 0 else None
    s0 = rs[0]["summary"] if rs else {}
    return {
        "method": name,
        "label": method_label(spec),
        "spec": dataclasses.asdict(spec),
        "sla_met": out["met"],
        "nodes": nodes,
        "gpus": gpus,
        "metrics": metrics,
        "output_tok_s": round(tok_s, 3),
        "output_tok_s_per_gpu": round(tok_s / gpus, 3) if gpus else None,
        "output_tok_s_per_user": s0.get("output_tok_s_per_user"),
        "acceptance_length": s0.get("acceptance_length"),
        "mean_verify_tokens_per_request": s0.get("mean_verify_tokens_per_request"),
        "cost_per_hour": round(cost_h, 2) if cost_h is not None else None,
        "cost_per_hour_spot": round(gpus * spot_price, 2) if spot_price is not None else None,
        "cost_per_million_output_tokens": round(per_m, 4) if per_m is not None else None,
        "search": [{"nodes": n, "passed": v} for n, v in out["trail"]],
        "acceptance_source": (s0.get("setup") or {}).get("acceptance_source"),
        "warnings": method_warnings(rs, slos),
    }


def method_warnings(results: Sequence[dict], slos: Iterable[SLO]) -> list[dict]:
    """The warnings (dsim.engine.diagnostics) of a method's simulations at its answer's node count, with the
    seeds that raised them: few_finished one per message; every other kind once, with the worst
    seed's value and message (each kind's value is worse the larger it is: it warns at or above
    its threshold)."""
    from dsim.engine.diagnostics import sla_warnings

    merged: dict = {}
    for r in results:
        s = r["summary"]
        ws = list(s.get("warnings", ())) + sla_warnings(slos, int(s["requests_completed"]))
        for w in ws:
            key = (w["kind"], w["message"]) if w["kind"] == "few_finished" else w["kind"]
            seen = merged.setdefault(key, {**w, "seeds": []})
            if w["value"] > seen["value"]:
                seen.update(w)
            seen["seeds"].append(int(r["seed"]))
    return list(merged.values())


def plan(
    workloads: dict,
    profile: Any,
    specs: dict,
    slos: Iterable[SLO],
    *,
    margin: float = 0.10,
    max_nodes: int = 64,
    seeds: Sequence[int] = (0, 1, 2),
    gpus_per_node: int = 8,
    price: float | None = None,
    jobs: int | None = None,
    router: str = "least_outstanding",
    start: dict | None = None,
    notes: list | None = None,
    progress: Callable[..., Any] | None = None,
    engine: Any = None,
    executor: str = "local",
    ray_address: str | None = None,
    progress_bar: Any = None,
) -> dict:
    """Fewest nodes per method meeting every SLO. workloads: seed -> Workload; specs: name -> SpecConfig.
    executor: 'local' (processes) or 'ray' (tasks; ray_address as in dsim.study.executor); progress: a
    callable per result; progress_bar: a dsim.study.progress.Progress."""
    if not slos:
        raise InputError("--sla: empty SLA")
    if not (0 <= margin < 1):
        raise InputError(f"--margin: must be in [0, 1), got {margin:g}")
    if max_nodes < 1:
        raise InputError(f"--max-nodes: must be >= 1, got {max_nodes}")
    seeds = list(seeds)
    if not seeds:
        raise InputError("--seeds: no seeds")
    if len(set(seeds)) != len(seeds):
        raise InputError(f"--seeds: repeated seed in {seeds}")
    if gpus_per_node < 1:
        raise InputError(f"--gpus-per-node: must be >= 1, got {gpus_per_node}")
    from dsim.study.prices import price_for

    cost = price_for(profile.provenance.get("hardware"), price)

    def point(name: str, n: int, s: int) -> Point:
        return Point(workloads[s], profile, specs[name], n, s, gpus_per_node, router, engine, tag=name)

    searches = {name: _Search(name, seeds, slos, margin, max_nodes, (start or {}).get(name, 1)) for name in specs}

    def warm() -> None:
        warm_kernels(point(name, 1, seeds[0]) for name in specs)

    with Runner(jobs, executor, ray_address, progress_bar, warm=warm) as runner:
        outs = search_nodes(point, searches, runner, slos, progress)
    res = {}
    for name, spec in specs.items():
        res[name] = summarize_method(
            name, spec, outs[name], slos, margin, gpus_per_node, cost.per_gpu_hour, cost.spot_per_gpu_hour
        )
        res[name].update(method_fit_fields(spec, profile))
    w0 = workloads[seeds[0]]
    names = list(specs)
    comp = None
    if len(names) >= 2:
        a, b = res[names[0]], res[names[-1]]
        priced = a["cost_per_hour"] is not None and b["cost_per_hour"] is not None
        comp = {
            "baseline": names[0],
            "candidate": names[-1],
            "nodes_saved": a["nodes"] - b["nodes"],
            "cost_per_hour_saved": round(a["cost_per_hour"] - b["cost_per_hour"], 2) if priced else None,
            "percent_saved": round(100.0 * (a["gpus"] - b["gpus"]) / a["gpus"], 1),
            "both_met": a["sla_met"] and b["sla_met"],
        }
    res["comparison"] = comp
    res["assumptions"] = {
        "sla": [s.describe() for s in slos],
        "margin": margin,
        "margin_rule": "a node count passes only if every latency SLO <= target x (1 - margin) and per-user "
        "speed >= target / (1 - margin), for every seed (worst seed counted)",
        "seeds": seeds,
        "workload": w0.source,
        "requests": int(len(w0)),
        "class_mix_assumed": bool(w0.class_mix_assumed),
        "class_mix": (
            "assumed (assigned by a mix, not carried by the trace)" if w0.class_mix_assumed else "carried by the trace"
        ),
        "load_model": f"open loop: the trace's arrival process is fixed; N nodes share it via the {router} router",
        "profile": profile.label,
        "profile_kind": profile.provenance.get("kind"),
        "profile_caveats": profile_caveats(profile.provenance),
        "acceptance": {n: res[n]["acceptance_source"] for n in specs},
        "gpus_per_node": gpus_per_node,
        "price_per_gpu_hour": cost.per_gpu_hour,
        "spot_price_per_gpu_hour": cost.spot_per_gpu_hour,
        "price_gpu": cost.gpu,
        "price_source": cost.source,
        "price_date": cost.date,
        "search": "exponential (1, 2, 4, ...) then bisection over node counts; first seed first, "
        "other seeds only where it passes",
        "max_nodes": max_nodes,
        "notes": list(notes or []),
    }
    return res


def method_fit_fields(spec: SpecConfig, profile: Any) -> dict:
    """Whether the profile's model can run the method and whose acceptance it is sized on
    (dsim.spec.capability), as a plan result's fields: ``hypothetical`` (the model lacks the head the
    method needs), ``fit`` (why), ``acceptance_origin`` (a short name for the table, None without
    drafts), ``acceptance_users`` (the user gave it) and ``acceptance_other_model`` (a preset of
    another model than the profile's; None where not known)."""
    from dsim.spec.capability import acceptance_origin, method_fit

    fit = method_fit(spec.method, profile)
    origin = acceptance_origin(spec.acceptance, spec.method, profile)
    return {
        "hypothetical": fit.hypothetical,
        "model_can_run": fit.runnable,
        "fit": fit.reason,
        "acceptance_origin": origin.label if origin is not None else None,
        "acceptance_users": origin.users if origin is not None else None,
        "acceptance_other_model": origin.other_model if origin is not None else None,
    }


def hypothetical_lines(res: dict, method_names: Iterable[str]) -> list[str]:
    """One line per method of a plan result that the model cannot run (hypothetical: why, and the
    acceptance it assumes) or that dsim could not check."""
    out = []
    for name in method_names:
        r = res[name]
        if r.get("hypothetical"):
            out.append(
                f"{r['label']} is hypothetical: {r['fit']}; sized on acceptance {r['acceptance_origin']}, an assumption"
            )
        elif r.get("model_can_run") is None and r.get("fit"):
            out.append(f"{r['label']}: {r['fit']}; not checked")
    return out


def profile_caveats(provenance: dict) -> list[str]:
    """What a profile's provenance says its numbers lean on beyond its method: silicon-table records
    guarded (dsim.profiling.aic_guard.moe_guard) and measured attention terms left out (validator.gpu.profile
    --no-attention-terms)."""
    out = []
    guard = (provenance.get("assumptions") or {}).get("table_guard")
    if guard:  # the fallback order stays in the profile's provenance
        out.append(
            f"silicon tables guarded: {guard.split(' (fallback order:')[0]} (provenance.assumptions.table_guard)"
        )
    att = provenance.get("attention_terms")
    if isinstance(att, str) and ("missing" in att or "dropped" in att):
        out.append(att)
    return out


# ---- printing -------------------------------------------------------------------------------


def format_plan(res: dict, slos: Iterable[SLO], method_names: Iterable[str]) -> str:
    lines = []
    a = res["assumptions"]
    method_names = list(method_names)
    # whose acceptance each method is sized on, in the table itself (where some method drafts)
    acc_col = any(res[n].get("acceptance_origin") for n in method_names)
    head = ["method", "nodes", "GPUs"] + [s.key for s in slos] + ["tok/s/GPU", "$/hour", "$/M out tok"]
    head += ["acceptance"] if acc_col else []
    rows = []
    for name in method_names:
        r = res[name]
        nodes = str(r["nodes"]) if r["sla_met"] else f"not met at {r['nodes']}"
        label = r["label"] + (" (hypothetical)" if r.get("hypothetical") else "")
        row = [label, nodes, str(r["gpus"])]
        for s in slos:
            m = r["metrics"][s.key]
            v = m["value"]
            vs = "n/a" if v is None else f"{v:.2f}"
            row.append(f"{vs} {'>=' if s.is_min else '<='} {m['limit']:.4g} {'ok' if m['ok'] else 'MISS'}")
        row += [
            f"{r['output_tok_s_per_gpu']:.1f}",
            "n/a" if r["cost_per_hour"] is None else f"{r['cost_per_hour']:.2f}",
            "n/a" if r["cost_per_million_output_tokens"] is None else f"{r['cost_per_million_output_tokens']:.3f}",
        ]
        if acc_col:
            row.append(r.get("acceptance_origin") or "none (no drafts)")
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    lines.append("(SLO cells: worst seed's value vs target x (1 - margin); latencies in ms)")
    lines += hypothetical_lines(res, method_names)
    c = res.get("comparison")
    if c:
        A, B = res[c["baseline"]], res[c["candidate"]]
        if c["both_met"]:
            saved = (
                f"${c['cost_per_hour_saved']:.2f}/hour saved"
                if c["cost_per_hour_saved"] is not None
                else "no dollar figure (no price for this hardware)"
            )
            lines.append(
                f"{B['label']} vs {A['label']}: {c['nodes_saved']:d} node(s) saved "
                f"({A['nodes']} -> {B['nodes']}), {saved} ({c['percent_saved']:.1f}%)"
            )
            if A.get("cost_per_hour_spot") is not None:
                lines.append(
                    f"  at the spot price ${a['spot_price_per_gpu_hour']:.2f}/GPU-h: ${A['cost_per_hour_spot']:.2f}/h -> "
                    f"${B['cost_per_hour_spot']:.2f}/h"
                )
        else:
            lines.append("comparison: not both SLAs met within --max-nodes; savings not computed")
    warned = [(res[n]["label"], w) for n in method_names for w in res[n].get("warnings", ())]
    if warned:
        lines.append("")
        lines.append("warnings (results a reader should not trust as they stand):")
        for label, w in warned:
            seeds = w.get("seeds")
            lines += field_lines(
                f"  {label}: ", w["message"] + (f" (seeds {', '.join(map(str, seeds))})" if seeds else "")
            )
    lines.append("")
    lines.append("assumptions:")
    lines.append(f"  SLA       : {'; '.join(a['sla'])}; margin {a['margin']:.0%} ({a['margin_rule']})")
    lines.append(f"  seeds     : {', '.join(str(s) for s in a['seeds'])}")
    lines += field_lines("  workload  : ", f"{a['workload']} ({a['requests']} requests)")
    lines.append(f"  load      : {a['load_model']}")
    lines.append(f"  classes   : {a['class_mix']}")
    lines += field_lines("  profile   : ", f"{a['profile']} (kind: {a['profile_kind']})")
    for c in a.get("profile_caveats") or []:
        lines += field_lines("  caveat    : ", c)
    for n, src in a["acceptance"].items():
        if src:
            lines.append(f"  acceptance: {n}: {src if len(src) < 160 else src[:157] + '...'}")
        else:
            lines.append(f"  acceptance: {n}: none (no speculation)")
    per_gpu = a["price_per_gpu_hour"]
    lines += field_lines(
        "  price     : ",
        (f"${per_gpu:.2f}/GPU-hour, " if per_gpu is not None else "")
        + f"{a['gpus_per_node']} GPUs/node; {a['price_source']}",
    )
    lines.append(f"  search    : {a['search']}; up to {a['max_nodes']} nodes")
    for n in a["notes"]:
        lines.append(f"  note      : {n}")
    return "\n".join(lines)
