"""Inter-node all-to-all records for wide expert parallelism, from measured DeepEP low-latency tables.

A data-parallel attention group whose expert-parallel group spans nodes (``dpN-epN`` with N > 8)
exchanges tokens over the inter-node network: DeepEP's low-latency dispatch (FP8) and combine
(bf16), pure RDMA (DeepSeek-V3 report Sec. 3.4; DeepSeek's DeepEP). The composer's records for it
are ``comm`` records with ``scope: inter_node`` (dsim.profiling.kernel_ops._moe_block_ops). This module prices
them into a kernel table from two public measurements:

- AIConfigurator's H200 table of DeepEP low-latency kernels measured across 1, 2, 4 and 8 nodes
  (aiconfigurator-core 0.12.0, ``systems/data/h200_sxm/comm/sglang/0.5.6.post2/
  wideep_deepep_ll_perf.parquet``: SGLang's wide-EP collector, hidden 7168, top-8, 256 experts,
  2-256 tokens per rank across nodes): the time at 8 nodes (EP64) is the base.
- DeepEP's README ("Low-latency kernels with pure RDMA", H800 with 400 Gb/s CX7 InfiniBand per
  GPU, 128 tokens per rank, hidden 7168, top-8): dispatch / combine latency at EP8..EP256. Its
  EP64 figures (173 / 314 us) agree with AIC's H200 EP64 ones (167 / 305 us at 128 tokens); its
  growth from EP64 to EP128 / EP256 scales the AIC base to wider groups (the RDMA bandwidth per
  GPU is flat from EP128 on, 39-40 GB/s, so groups wider than 256 take EP256's factor: an
  assumption, stated in every record).

Other shapes: the messages scale with tokens x hidden x top-k (each token goes to top-k ranks,
one expert per rank at EP = experts), so a record of n tokens per rank at hidden h and top-k k is
priced at the AIC base's n x h x k / (7168 x 8) tokens (log-log interpolation; below the table's
smallest token count, its smallest: the latency floor). Command:

    dsim profile deepep build --model deepseek-v4-flash:256 --model deepseek-v4-pro:384 \
        --out profiles/kernels/h200-deepep-internode.json

Needs ``aiconfigurator-core`` (the optional ``aic`` extra) and pandas to build; the shipped table
needs neither.

``published`` prices the same records from DeepEP's published figures alone (no AIC): its README's
low-latency table (H800, one CX7 400 Gb/s NIC per GPU, 128 tokens per rank, hidden 7168, top-8; EP8 to
EP256, log-linear in the group width between its points, EP256's beyond) gives the time at 128
tokens, and a record of n tokens costs the latency floor plus the rest in proportion to its message,
floor + (t128 - floor) x n h k / (128 x 7168 x 8). The floor (28.7 / 30.8 us, dispatch / combine) is
AIC's H200 EP64 series at its smallest message, the one figure not from DeepEP (this line over the
AIC series: within 7% from 24 to 192 tokens). Needs nothing installed:

    dsim profile deepep published --model deepseek-v3:16,32,64,72,128,144,256 \
        --out profiles/kernels/h800-deepep-ll-published.json

``derive`` writes a what-if table from a built one, for a stated deployment the measurements do
not cover (a scenario assumption, never a measurement):

- ``--nic-gbps G``: a scale-out NIC of G Gb/s per GPU in place of the measured 400 Gb/s (e.g. 800
  for ConnectX-8 class NICs). Each series (kind, EP width, shape) keeps its latency floor, its
  smallest-message time, and its time above that floor is scaled by 400 / G: the measured kernels
  are bandwidth-bound above the floor (DeepEP README: 39-43 GB/s per GPU from EP64 on at 128
  tokens per rank, 78-86% of the 50 GB/s line rate), assumed to keep that efficiency on the faster
  NIC.
- ``--max-tokens-per-rank N``: records up to N tokens per rank, for a MoE block run in one pass
  (``dsim profile compose profile --moe-dp-chunk 0``; DeepEP V2's ``ElasticBuffer`` takes the step's
  ``num_max_tokens_per_rank``, its own benchmark runs 8K tokens per batch). Beyond the measured
  series, the time grows linearly at the slope of its last two measured records (the bandwidth
  regime).

    dsim profile deepep derive --table profiles/kernels/h200-deepep-internode.json \
        --nic-gbps 800 --name h200-deepep-internode-800g --out OUT.json
"""

from __future__ import annotations

if __name__ == "__main__":  # a Ctrl-C while the modules below load: quiet exit 130
    from dsim.cli.toolmain import startup_guard

    startup_guard("dsim profile deepep")

import argparse
import datetime as _dt
import json
import math
import sys
from pathlib import Path
from typing import Any

from dsim.errors import InputError
from dsim.profiling.models import load_model

AIC_VERSION = "0.12.0"
AIC_LL_FILE = "h200_sxm/comm/sglang/0.5.6.post2/wideep_deepep_ll_perf.parquet"
BASE_NODES = 8  # the widest group AIC measured: 8 nodes x 8 GPUs (EP64)
BASE_EXPERTS = 256
REF_HIDDEN, REF_TOPK = 7168, 8  # the shape AIC's and DeepEP's tables were measured at
#: DeepEP README, low-latency kernels, H800 + CX7 400 Gb/s, 128 tokens per rank: EP -> (dispatch, combine) us
DEEPEP_README_LL_US = {8: (77, 114), 16: (118, 195), 32: (155, 273), 64: (173, 314), 128: (192, 369), 256: (194, 360)}
#: the low-latency kernels' latency floor (us, dispatch / combine): AIC's H200 EP64 series at its smallest
#: message (0.75 tokens of hidden 7168 top-8: h200-deepep-internode.json's EP384 records over their EP256 factor)
LL_FLOOR_US = (28.7, 30.8)
#: tokens per rank the records are priced at (the composer's MoE chunk is at most 256 tokens per rank)
TOKENS_PER_RANK = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
KINDS = ("a2a_dispatch", "a2a_combine")


def ep_scale(gpus: int, kind: str) -> float:
    """DeepEP README latency at `gpus` over that at EP64 (log-linear in the group width between its
    points; EP256's beyond 256, where its bandwidth per GPU is flat)."""
    i = KINDS.index(kind)
    pts = sorted(DEEPEP_README_LL_US)
    g = min(max(int(gpus), BASE_NODES * 8), pts[-1])
    base = DEEPEP_README_LL_US[BASE_NODES * 8][i]
    for a, b in zip(pts, pts[1:]):
        if a <= g <= b:
            f = (math.log(g) - math.log(a)) / (math.log(b) - math.log(a))
            ya, yb = DEEPEP_README_LL_US[a][i], DEEPEP_README_LL_US[b][i]
            return (ya + f * (yb - ya)) / base
    return 1.0


def readme_ll_us(gpus: int, kind: str) -> float:
    """DeepEP README's low-latency time (us) at 128 tokens per rank on an EP group of `gpus` (log-linear
    in the width between its points; EP256's beyond, where its RDMA bandwidth per GPU is flat)."""
    i = KINDS.index(kind)
    pts = sorted(DEEPEP_README_LL_US)
    g = min(max(int(gpus), pts[0]), pts[-1])
    for a, b in zip(pts, pts[1:]):
        if a <= g <= b:
            f = (math.log(g) - math.log(a)) / (math.log(b) - math.log(a))
            ya, yb = DEEPEP_README_LL_US[a][i], DEEPEP_README_LL_US[b][i]
            return ya + f * (yb - ya)
    raise AssertionError("unreachable")


def published_us(kind: str, tokens: float, hidden: int, topk: int, gpus: int) -> float:
    """One low-latency dispatch or combine (us) from DeepEP's published table (module doc, ``published``)."""
    floor = LL_FLOOR_US[KINDS.index(kind)]
    eq = tokens * hidden * topk / (REF_HIDDEN * REF_TOPK)
    return floor + (readme_ll_us(gpus, kind) - floor) * eq / 128.0


def _comm_record(kind: str, ep: int, n: int, m, width: float, ms: float, note: str) -> dict:
    """One inter-node all-to-all record: ``n`` tokens of ``m``'s hidden size over an EP group of ``ep``."""
    return dict(
        op="comm",
        kind=kind,
        gpus=int(ep),
        bytes=int(n * m.hidden * width),
        scope="inter_node",
        hidden=m.hidden,
        topk=m.topk,
        experts=m.experts,
        ms=round(ms, 5),
        note=note,
    )


def published_records(model_name: str, ep: int) -> list[dict]:
    """The composer's inter-node dispatch / combine records of `model_name` on EP `ep`, from DeepEP's
    published low-latency table (published_us)."""
    if ep <= 8:
        raise InputError(f"EP {ep}: inter-node records need an EP group wider than one 8-GPU node")
    m = load_model(model_name)
    out = []
    for n in TOKENS_PER_RANK:
        for kind, width in (("a2a_dispatch", 1), ("a2a_combine", 2)):
            us = published_us(kind, n, m.hidden, m.topk, ep)
            note = (
                f"DeepEP README low-latency, H800 + CX7 400 Gb/s: {readme_ll_us(ep, kind):.0f} us at 128 tokens of "
                f"hidden {REF_HIDDEN} top-{REF_TOPK} on EP{min(ep, 256)}"
                + (" (EP256's beyond 256, assumed)" if ep > 256 else "")
                + f"; {n} tokens of hidden {m.hidden} top-{m.topk}: floor {LL_FLOOR_US[KINDS.index(kind)]} us "
                "+ the rest in proportion to the message"
            )
            out.append(_comm_record(kind, ep, n, m, width, us / 1000.0, note))
    return out


def build_published(specs: list[tuple[str, int]], out: str = "profiles/kernels/h800-deepep-ll-published.json") -> dict:
    recs: list[dict] = []
    for name, ep in specs:
        recs += published_records(name, ep)
    models: dict[str, list[int]] = {}
    for name, ep in specs:
        models.setdefault(name, []).append(ep)
    return dict(
        name=Path(out).name.split(".")[0],
        provenance=dict(
            kind="published",
            hardware="NVIDIA H800 SXM, one ConnectX-7 400 Gb/s InfiniBand NIC per GPU (DeepEP's test bed)",
            engine="DeepEP low-latency kernels (pure RDMA)",
            engine_version="DeepEP V1 (docs/legacy.md)",
            date=str(_dt.date.today()),
            method=(
                "inter-node dispatch (FP8) / combine (bf16) per MoE layer: DeepEP README's low-latency time at 128 "
                "tokens per rank for the group's EP (log-linear between its EP8-EP256 points, EP256's beyond), "
                "a record of n tokens = floor + (t128 - floor) x its message / the 128-token message (tokens x "
                "hidden x top-k)"
            ),
            command="dsim profile deepep published "
            + " ".join(f"--model {n}:{','.join(map(str, e))}" for n, e in models.items())
            + f" --out {out}",
            source=(
                "deepseek-ai/DeepEP docs/legacy.md (the V1 README), 'Low-latency kernels with pure RDMA' table; "
                f"the latency floor from NVIDIA AIConfigurator (aiconfigurator-core {AIC_VERSION}) {AIC_LL_FILE}"
            ),
            assumptions=dict(
                floor=f"latency floor {LL_FLOOR_US[0]} / {LL_FLOOR_US[1]} us (dispatch / combine) at every EP: "
                "AIC's H200 EP64 series at its smallest message",
                token_scaling="above the floor, time in proportion to the message (bandwidth-bound: DeepEP's "
                "RDMA bandwidth per GPU is 39-48 GB/s from EP32 on)",
                other_gpus="the same NIC (CX7 400 Gb/s per GPU) serves H100 and H200 deployments alike; AIC's "
                "H200 EP64 figures at 128 tokens (167 / 305 us) are within 3.5% of this table's H800 ones "
                "(173 / 314)",
            ),
        ),
        records=recs,
    )


def interp_loglog(points: list[tuple[float, float]], x: float) -> float:
    """y at x on sorted (x, y) points, log-log linear; clamped to the end points outside them."""
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))
    raise AssertionError("unreachable")


def base_series(rows: list[dict], kind: str, nodes: int = BASE_NODES) -> list[tuple[float, float]]:
    """(tokens per rank, us) of AIC's rows at `nodes` nodes and 256 experts for dispatch or combine."""
    col = "dispatch_avg_t_us" if kind == "a2a_dispatch" else "combine_avg_t_us"
    pts = sorted(
        (float(r["num_token"]), float(r[col]))
        for r in rows
        if int(r["node_num"]) == nodes and int(r["num_experts"]) == BASE_EXPERTS
    )
    if len(pts) < 2:
        raise InputError(f"{AIC_LL_FILE}: no {kind} series at {nodes} nodes and {BASE_EXPERTS} experts")
    return pts


def price(rows: list[dict], kind: str, tokens: float, hidden: int, topk: int, gpus: int) -> tuple[float, dict]:
    """(ms, how) of one dispatch or combine of `tokens` per rank over an EP group of `gpus` GPUs."""
    if gpus <= 8:
        raise InputError(f"gpus {gpus}: inter-node records need an EP group wider than one 8-GPU node")
    nodes = gpus // 8
    measured = nodes in (2, 4, 8) and gpus % 8 == 0
    series = base_series(rows, kind, nodes if measured else BASE_NODES)
    eq = tokens * hidden * topk / (REF_HIDDEN * REF_TOPK)
    scale = 1.0 if measured else ep_scale(gpus, kind)
    us = interp_loglog(series, eq) * scale
    how = dict(aic_nodes=nodes if measured else BASE_NODES, aic_tokens=round(eq, 3), ep_scale=round(scale, 4))
    return us / 1000.0, how


def records(rows: list[dict], model_name: str, ep: int) -> list[dict]:
    """The composer's inter-node dispatch / combine records of `model_name` on EP `ep` (bytes per GPU
    as dsim.profiling.kernel_ops writes them: tokens x hidden, FP8 dispatch, bf16 combine)."""
    m = load_model(model_name)
    out = []
    for n in TOKENS_PER_RANK:
        for kind, width in (("a2a_dispatch", 1), ("a2a_combine", 2)):
            ms, how = price(rows, kind, n, m.hidden, m.topk, ep)
            note = (
                f"AIC H200 DeepEP low-latency at {how['aic_nodes']} nodes, {how['aic_tokens']} tokens of hidden "
                f"{REF_HIDDEN} top-{REF_TOPK} (= {n} tokens of hidden {m.hidden} top-{m.topk})"
                + (f", x {how['ep_scale']} DeepEP README EP64 -> EP{min(ep, 256)}" if how["ep_scale"] != 1.0 else "")
                + (" (EP256's factor: assumed flat beyond 256)" if ep > 256 else "")
            )
            out.append(_comm_record(kind, ep, n, m, width, ms, note))
    return out


def load_aic_rows() -> tuple[list[dict], str]:
    try:
        import aiconfigurator_core  # type: ignore[import-not-found]
        import pandas as pd
    except ImportError:
        raise InputError(
            "building the inter-node table needs aiconfigurator-core (pip install 'dsim[aic]') and pandas"
        ) from None
    path = Path(aiconfigurator_core.__file__).resolve().parent / "systems" / "data" / AIC_LL_FILE
    if not path.is_file():
        raise InputError(f"{path}: not found in the installed aiconfigurator-core")
    return pd.read_parquet(path).to_dict("records"), str(path)


def build(specs: list[tuple[str, int]]) -> dict[str, Any]:
    rows, _ = load_aic_rows()
    recs: list[dict] = []
    for name, ep in specs:
        recs += records(rows, name, ep)
    return dict(
        name="h200-deepep-internode",
        provenance=dict(
            kind="silicon-table",
            hardware="NVIDIA H200 SXM, 400 Gb/s InfiniBand per GPU (AIC's wide-EP collection)",
            engine="DeepEP low-latency kernels (SGLang wide-EP collector)",
            engine_version="sglang 0.5.6.post2",
            date=str(_dt.date.today()),
            method=(
                "inter-node dispatch (FP8) / combine (bf16) per MoE layer: AIC's H200 DeepEP low-latency table "
                "at the group's node count where measured (2, 4, 8 nodes), else at 8 nodes (EP64) scaled by "
                "DeepEP README's low-latency latency ratio EP64 -> EP128/EP256 (H800, CX7 400 Gb/s; flat beyond "
                "256, assumed); other shapes at equal tokens x hidden x top-k, log-log in tokens, the table's "
                "smallest token count below it"
            ),
            command="dsim profile deepep build "
            + " ".join(f"--model {n}:{e}" for n, e in specs)
            + " --out profiles/kernels/h200-deepep-internode.json",
            source=(
                f"NVIDIA AIConfigurator (aiconfigurator-core {AIC_VERSION}, Apache-2.0) {AIC_LL_FILE}; "
                "deepseek-ai/DeepEP README, 'Low-latency kernels with pure RDMA' table"
            ),
            assumptions=dict(
                wider_than_measured="groups wider than 64 GPUs: AIC's EP64 times x DeepEP README's EP64 -> EP "
                "latency ratio (1.11 / 1.18 at EP128, 1.12 / 1.15 at EP256, dispatch / combine); beyond 256 "
                "GPUs EP256's",
                shape_scaling="time at equal message volume (tokens x hidden x top-k) as the measured shape",
            ),
        ),
        records=recs,
    )


MEASURED_NIC_GBPS = 400.0


def derive(
    table: dict[str, Any],
    nic_gbps: float = MEASURED_NIC_GBPS,
    max_tokens_per_rank: int = 0,
    name: str = "",
    table_path: str = "",
) -> dict[str, Any]:
    """A what-if table from a built one (see the module doc): each series' time above its latency
    floor scaled by 400 / nic_gbps, and records added up to `max_tokens_per_rank` tokens per rank
    at the slope of the series' last two measured records."""
    if not nic_gbps > 0:
        raise InputError(f"--nic-gbps {nic_gbps}: expected a bandwidth > 0 Gb/s")
    recs = [r for r in table.get("records", []) if r.get("op") == "comm" and r.get("scope") == "inter_node"]
    if not recs:
        raise InputError("derive: the table has no inter-node comm records")
    series: dict[tuple, list[dict]] = {}
    for r in recs:
        series.setdefault((r["kind"], int(r["gpus"]), int(r["hidden"]), int(r["topk"]), int(r["experts"])), []).append(
            r
        )
    width = {"a2a_dispatch": 1, "a2a_combine": 2}
    bw = MEASURED_NIC_GBPS / float(nic_gbps)
    out = []
    for (kind, _gpus, hidden, _topk, _experts), rs in series.items():
        rs = sorted(rs, key=lambda r: r["bytes"])
        floor = min(float(r["ms"]) for r in rs)
        pts = [(r["bytes"] / (hidden * width[kind]), float(r["ms"])) for r in rs]
        ext = []
        if max_tokens_per_rank > pts[-1][0] and len(pts) >= 2:
            (n0, t0), (n1, t1) = pts[-2], pts[-1]
            slope = max(0.0, (t1 - t0) / (n1 - n0))
            n = n1
            while n < max_tokens_per_rank:
                n = min(max_tokens_per_rank, n * 2 if n >= 256 else n + 128)
                ext.append((n, t1 + slope * (n - n1), n1))
        for r in rs:
            ms = floor + (float(r["ms"]) - floor) * bw
            note = r["note"] + (
                f"; what-if NIC {nic_gbps:g} Gb/s: floor {floor:g} ms + (t - floor) x {bw:.4g}" if bw != 1.0 else ""
            )
            out.append({**r, "ms": round(ms, 5), "note": note})
        for n, t, n1 in ext:
            ms = floor + (t - floor) * bw
            out.append(
                dict(
                    rs[-1],
                    bytes=int(n * hidden * width[kind]),
                    ms=round(ms, 5),
                    note=f"{n:g} tokens per rank: the {n1:g}-token record + its last measured slope x {n - n1:g} tokens "
                    f"(bandwidth regime, extrapolated)"
                    + (
                        f"; what-if NIC {nic_gbps:g} Gb/s: floor {floor:g} ms + (t - floor) x {bw:.4g}"
                        if bw != 1.0
                        else ""
                    ),
                )
            )
    prov = dict(table.get("provenance", {}))
    src = table_path or f"profiles/kernels/{table.get('name', 'TABLE')}.json"
    cmd = f"dsim profile deepep derive --table {src}"
    if nic_gbps != MEASURED_NIC_GBPS:
        cmd += f" --nic-gbps {nic_gbps:g}"
        prov["hardware"] = f"what-if: {prov.get('hardware', 'H200')}, the NIC at {nic_gbps:g} Gb/s per GPU (assumed)"
    if max_tokens_per_rank:
        cmd += f" --max-tokens-per-rank {max_tokens_per_rank}"
    new_name = name or table.get("name", "deepep")
    cmd += f" --name {new_name} --out profiles/kernels/{new_name}.json"
    prov.update(
        kind="what-if",
        derived_from=table.get("name", ""),
        command=cmd,
        assumptions=dict(
            prov.get("assumptions", {}),
            what_if=(
                f"time above each series' latency floor x 400 / {nic_gbps:g} (bandwidth-bound above the floor, "
                "the measured efficiency kept)"
                if bw != 1.0
                else "none on bandwidth"
            )
            + (
                f"; records to {max_tokens_per_rank} tokens per rank, linear beyond the measured series at its last "
                "slope"
                if max_tokens_per_rank
                else ""
            ),
        ),
    )
    return dict(name=new_name, provenance=prov, records=out)


def _spec(s: str) -> tuple[str, int]:
    name, _, ep = s.partition(":")
    try:
        e = int(ep)
    except ValueError:
        e = 0
    if not name or e <= 8:
        raise InputError(f"--model {s!r}: expected MODEL:EP with EP > 8 (e.g. deepseek-v4-flash:256)")
    return name, e


def _specs(s: str) -> list[tuple[str, int]]:
    name, _, eps = s.partition(":")
    return [_spec(f"{name}:{e}") for e in eps.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dsim profile deepep", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="price the inter-node all-to-all records into a kernel table")
    b.add_argument("--model", action="append", required=True, help="MODEL:EP, repeatable")
    b.add_argument("--out", required=True)
    p = sub.add_parser("published", help="the records from DeepEP's published low-latency table (no AIC)")
    p.add_argument("--model", action="append", required=True, help="MODEL:EP[,EP...], repeatable")
    p.add_argument("--out", required=True)
    d = sub.add_parser("derive", help="a what-if table from a built one: NIC bandwidth, tokens per rank")
    d.add_argument("--table", required=True, help="a built inter-node table (JSON)")
    d.add_argument("--nic-gbps", type=float, default=MEASURED_NIC_GBPS)
    d.add_argument("--max-tokens-per-rank", type=int, default=0)
    d.add_argument("--name", default="")
    d.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    from dsim.cli.toolmain import run_tool

    return run_tool("dsim profile deepep", lambda: _run(a))


def _run(a) -> int:
    from dsim.outputs import check_file_target, write_file
    from dsim.schema import read_json

    check_file_target(a.out, "--out")  # refused before any work
    if a.cmd == "published":
        specs = [(n, e) for s in a.model for n, e in _specs(s)]
        table = build_published(specs, a.out)
    elif a.cmd == "derive":
        src = read_json(a.table, what="--table")
        table = derive(src, a.nic_gbps, a.max_tokens_per_rank, a.name, a.table)
    else:
        table = build([_spec(s) for s in a.model])
    write_file(a.out, json.dumps(table, indent=1) + "\n")
    print(f"{len(table['records'])} records -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
