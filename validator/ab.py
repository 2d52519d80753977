"""A/B on real servers: start A, replay the workload at each load, stop it; the same for B; report
measured A vs B (and predicted, when profiles are given) in Markdown and JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from validator import compare, driver, launch, measure, server, traces

KEYS = (
    ("tpot_ms_p50", "TPOT p50 ms"),
    ("ttft_ms_p50", "TTFT p50 ms"),
    ("e2e_ms_p50", "E2E p50 ms"),
    ("output_tok_s", "output tok/s"),
)


def _side(tag, cmd, url, out: Path, plan, concurrencies, health_timeout_s, request_timeout_s) -> dict:
    """One side: ``cmd`` a shell command (started in its own process group, ``url`` polled) or a
    launch.ServerSpec (started managed: placement, warm-up; its log kept as server-TAG.log)."""
    files = {}

    def measure_all(url, flags, cpus):
        for c in concurrencies:
            path = out / f"{tag}-c{c}.jsonl"
            opts = driver.RunOptions(
                server=url,
                concurrency=c,
                progress=False,
                request_timeout_s=request_timeout_s,
                cpus=cpus,
                extra_header={"server_flags": flags, "ab_side": tag},
            )
            driver.run(plan, opts, path)
            files[c] = str(path)

    if isinstance(cmd, launch.ServerSpec):
        spec = dataclasses.replace(cmd, log_dir=str(out / f"server-{tag}"))
        with launch.managed(spec) as run:
            assert run is not None
            measure_all(run.url, run.flags, run.front_cpus)
        return files
    log = out / f"server-{tag}.log"
    proc = server.start(cmd, log_path=log)
    try:
        server.wait_health(url, health_timeout_s, proc, log)
        measure_all(url, cmd, None)
    finally:
        server.stop(proc)
    return files


def _label(side) -> str:
    if isinstance(side, launch.ServerSpec):
        return f"{side.engine} {side.model or side.command} " + " ".join(side.vllm_args)
    return str(side)


def ab(
    serve_a: str,
    serve_b: str,
    out,
    url_a: str,
    url_b: str,
    concurrencies,
    requests: int,
    input_len: int,
    output_len: int,
    trace=None,
    profiles=(None, None),
    acceptances=(None, None),
    health_timeout_s: float = 180.0,
    request_timeout_s: float = 120.0,
) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plan = traces.load(trace, requests, input_len, output_len)
    sides = {
        "A": _side("A", serve_a, url_a, out, plan, concurrencies, health_timeout_s, request_timeout_s),
        "B": _side("B", serve_b, url_b, out, plan, concurrencies, health_timeout_s, request_timeout_s),
    }
    rows = []
    for c in concurrencies:
        row = {"concurrency": c}
        for tag, prof, acc in (("A", profiles[0], acceptances[0]), ("B", profiles[1], acceptances[1])):
            m = measure.read(sides[tag][c])
            s = m.stats()
            row[tag] = {k: s.get(k) for k, _ in KEYS}
            row[tag]["failed"] = s.get("requests_failed")
            row[tag]["acceptance_length"] = (s.get("spec") or {}).get("acceptance_length")
            if prof:
                p = compare.simulate_measurement(m, prof, acc)
                row[tag + "_pred"] = {
                    "tpot_ms_p50": (p.get("tpot_ms") or {}).get("p50"),
                    "ttft_ms_p50": (p.get("ttft_ms") or {}).get("p50"),
                    "e2e_ms_p50": (p.get("e2e_ms") or {}).get("p50"),
                    "output_tok_s": p.get("output_tok_s"),
                }
        rows.append(row)
    md = [
        "# A/B on real servers: measured" + (" vs predicted" if any(profiles) else ""),
        "",
        f"- A: `{_label(serve_a)}`",
        f"- B: `{_label(serve_b)}`",
        f"- workload: {plan.source}, {len(plan)} requests per load, closed loop",
        "",
    ]
    hdr = "| concurrency | metric | A | B | B/A |" + (" A pred | B pred | B/A pred |" if any(profiles) else "")
    md += [hdr, "|" + "---|" * (hdr.count("|") - 1)]
    for row in rows:
        for k, label in KEYS:
            a, b = row["A"].get(k), row["B"].get(k)
            ratio = (b / a) if a and b else None
            line = f"| {row['concurrency']} | {label} | {compare._fmt(a)} | {compare._fmt(b)} | {compare._fmt(ratio)} |"
            if any(profiles):
                pa, pb = (row.get("A_pred") or {}).get(k), (row.get("B_pred") or {}).get(k)
                pr = (pb / pa) if pa and pb else None
                line += f" {compare._fmt(pa)} | {compare._fmt(pb)} | {compare._fmt(pr)} |"
            md.append(line)
    rep = {
        "serve_a": _label(serve_a),
        "serve_b": _label(serve_b),
        "concurrencies": list(concurrencies),
        "workload": plan.source,
        "rows": rows,
        "files": sides,
    }
    text = "\n".join(md) + "\n"
    (out / "ab.md").write_text(text)
    (out / "ab.json").write_text(json.dumps(rep, indent=1, default=str))
    rep["markdown"] = text
    return rep
