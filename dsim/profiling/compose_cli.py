"""Step-cost composer: a dsim profile for a MoE model under a deployment topology, from kernel tables.

The command ``dsim profile compose`` (also ``python3 -m dsim.profiling.compose_cli``): ``required-ops``
lists every kernel-op record a composition looks up, ``profile`` writes the profile
(dsim.profiling.compose.compose_profile).
"""

from __future__ import annotations

if __name__ == "__main__":  # a Ctrl-C while the modules below load: quiet exit 130
    from dsim.cli.toolmain import startup_guard

    startup_guard("dsim profile compose")

import argparse
import dataclasses
import json
import sys

from dsim.cost import save_profile
from dsim.errors import InputError
from dsim.profiling.attention_published import ATTENTION_KERNELS
from dsim.profiling.compose import VLLM_MOE_DP_CHUNK, compose_profile, required_ops
from dsim.profiling.executor_terms import block_pool_source
from dsim.profiling.forward import EAGER_US_PER_LAYER
from dsim.profiling.kernel_tables import HARDWARE
from dsim.profiling.models import load_model
from dsim.profiling.overlap import DBO_DECODE_TOKEN_THRESHOLD, OVERLAPS, parse_dbo_threshold
from dsim.profiling.pricer import BACKENDS, load_table_spec, shipped_table_for
from dsim.profiling.request_attention import VERIFY_ATTENTION
from dsim.profiling.topology import parse_topology


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dsim profile compose", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("required-ops", "profile"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True)
        p.add_argument("--topology", required=True)
        p.add_argument("--hardware", required=True, choices=sorted(HARDWARE))
        p.add_argument("--max-capture", type=int, default=None)
        p.add_argument(
            "--eager-us-per-layer",
            type=float,
            default=EAGER_US_PER_LAYER,
            help=f"what each layer adds to a step above the capture limit, run without CUDA graphs (default "
            f"{EAGER_US_PER_LAYER:g}, stated; 0 for an executor that captures every step)",
        )
        p.add_argument("--draft-block", type=int, default=7)
        p.add_argument(
            "--forward-q",
            type=int,
            default=1,
            help="price the forward table as requests of this many query tokens each (default 1: decode tokens)",
        )
        p.add_argument(
            "--moe-dp-chunk",
            type=int,
            default=None,
            help="data-parallel topologies: run the MoE block in chunks of this many tokens per rank "
            f"(default {VLLM_MOE_DP_CHUNK}, vLLM's VLLM_MOE_DP_CHUNK_SIZE; 0: one pass, as the shard executor)",
        )
        p.add_argument(
            "--overlap",
            choices=OVERLAPS,
            default="none",
            help="dbo: two-batch overlap, the all-to-all of one micro-batch hidden behind the other's compute "
            "(DeepSeek-V3 report Sec. 3.4; vLLM --enable-dbo); DP + EP topologies only",
        )
        p.add_argument(
            "--dbo-threshold",
            default=str(DBO_DECODE_TOKEN_THRESHOLD),
            help="with --overlap dbo: split steps of at least this many tokens per rank (default 32, vLLM's "
            "dbo_decode_token_threshold), or 'auto' (from where splitting is no slower)",
        )
        p.add_argument(
            "--expert-dtype",
            choices=("fp8", "fp4", "w4a16"),
            default=None,
            help="serve the routed experts in this dtype (default: as released where the hardware runs "
            "it natively, else the FP8-expert variant)",
        )
    prof = sub.choices["profile"]
    prof.add_argument(
        "--kernels",
        default=None,
        help="kernel table(s), comma-separated in order of preference (profiles/kernels/NAME.json; NAME@HW: "
        "that table carried to hardware HW by the per-op roofline ratio); roofline if absent",
    )
    prof.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="without --kernels: AIC's silicon tables of this serving engine on --hardware (the shipped "
        "<hardware>-aic-<backend> table; others: dsim profile aic profile); the name carries it",
    )
    prof.add_argument(
        "--attention-kernels",
        choices=ATTENTION_KERNELS,
        default=None,
        help="price the MLA decode attention cores from a published kernel source (flashmla-published: DeepSeek's "
        "FlashMLA at its README's H800 rates, for a deployment that runs DeepSeek's kernels) instead of the tables' "
        "attention records; the projections then priced as their own GEMMs",
    )
    prof.add_argument("--prefer", default="", help="op=TABLE,...: the table asked first for that op kind")
    prof.add_argument("--zero-ops", default="", help="op kinds priced at 0, e.g. comm (a one-GPU shard check)")
    prof.add_argument(
        "--layer-records",
        default=None,
        help="JSON of measured 'layer' records: fit the per-layer glue on them (half fit, half check)",
    )
    prof.add_argument(
        "--no-request-attention",
        action="store_true",
        help="leave out the per-request attention table (profile format 3): attention priced by total tokens and KV",
    )
    prof.add_argument(
        "--step-indexer",
        action="store_true",
        help="V4: add the longest-context indexer term (profile format 4) of an executor that scores every token of a "
        "step over the step's longest context, as our H200 shard executor does (not vLLM)",
    )
    prof.add_argument(
        "--step-keys",
        action="store_true",
        help="V4 (with --step-indexer): price the attention cores' key lists as our H200 shard executor runs them, "
        "every token's as long as the step's longest and split-K by the step's own tokens (profile format 4; not vLLM)",
    )
    prof.add_argument(
        "--verify-attention",
        choices=VERIFY_ATTENTION,
        default="window",
        help="price a q-token verify window as the kernel tables' window records (default) or as q one-token "
        "decodes at the request's context (tokens: kernels that process tokens as independent elements)",
    )
    prof.add_argument(
        "--block-pool",
        default=None,
        help="JSON of a block_pool fit (python3 -m validator.gpu.shard_repredict fit-pool): price pooling completed "
        "compressed-cache blocks as our H200 shard executor runs it (profile format 5; not vLLM)",
    )
    prof.add_argument("--name", default=None)
    prof.add_argument("--out", required=True)
    prof.add_argument(
        "--table-error", default=None, help="JSON file: the table's measured error (carried into provenance)"
    )
    a = ap.parse_args(argv)
    from dsim.cli.toolmain import run_tool

    return run_tool("dsim profile compose", lambda: _run(a, argv))


def _run(a, argv: list[str] | None) -> int:
    """The command ``a`` (parsed arguments); InputError for bad input (see dsim.toolmain)."""
    if a.cmd == "profile":
        from dsim.outputs import check_file_target

        check_file_target(a.out, "--out")  # refused before any work
    model = load_model(a.model)
    if a.expert_dtype:
        if a.expert_dtype == "fp4" and HARDWARE[a.hardware]["fp4"] is None:
            raise InputError(
                f"--expert-dtype fp4: {HARDWARE[a.hardware]['name']} has no FP4 tensor cores (use w4a16 or fp8)"
            )
        model = dataclasses.replace(model, expert_dtype=a.expert_dtype)
    topo = parse_topology(a.topology)
    if a.cmd == "required-ops":
        json.dump(
            required_ops(
                model,
                topo,
                a.hardware,
                a.max_capture,
                a.draft_block,
                a.forward_q,
                moe_dp_chunk=a.moe_dp_chunk,
                overlap=a.overlap,
            ),
            sys.stdout,
            indent=0,
        )
        sys.stdout.write("\n")
        return 0
    table = [load_table_spec(k.strip()) for k in a.kernels.split(",") if k.strip()] if a.kernels else None
    if a.backend and table is None:
        table = [shipped_table_for(a.hardware, a.backend, topo.name)]
        kern = f"-{a.attention_kernels.split('-')[0]}" if a.attention_kernels else ""  # e.g. -flashmla
        a.name = a.name or f"{model.name}-{a.hardware}-{a.backend}{kern}-{topo.name}" + (
            "-dbo" if a.overlap == "dbo" else ""
        )
    zero = frozenset(x.strip() for x in a.zero_ops.split(",") if x.strip())
    prefer = {}
    for item in (x.strip() for x in a.prefer.split(",") if x.strip()):
        op, eq, tname = item.partition("=")
        if not eq:
            raise InputError(f"--prefer {item!r}: expected OP=TABLE, e.g. mhc=h200-aic-vllm")
        prefer[op.strip()] = tname.strip()
    from dsim.schema import read_json

    layer_recs = None
    if a.layer_records:
        d = read_json(a.layer_records, what="--layer-records")
        layer_recs = d.get("records") if isinstance(d, dict) else d
        if not isinstance(layer_recs, list) or not all(isinstance(r, dict) for r in layer_recs):
            raise InputError(f"--layer-records {a.layer_records}: expected a list of records (or {{'records': [...]}})")
    err = read_json(a.table_error, what="--table-error") if a.table_error else None
    if err is not None and not isinstance(err, dict):
        raise InputError(f"--table-error {a.table_error}: expected a JSON object (kernels_aic --error-summary)")
    pool = None
    if a.block_pool:
        pool = read_json(a.block_pool, what="--block-pool")
        if not isinstance(pool, dict):
            raise InputError(f"--block-pool {a.block_pool}: expected a JSON object (shard_repredict fit-pool)")
        pool.setdefault("source", block_pool_source(pool, a.block_pool))
    cmd = "dsim profile compose " + " ".join(argv if argv is not None else sys.argv[1:])
    prof_ = compose_profile(
        model,
        topo,
        a.hardware,
        table,
        name=a.name,
        max_capture=a.max_capture,
        draft_block=a.draft_block,
        table_error=err,
        command=cmd,
        zero_ops=zero,
        layer_records=layer_recs,
        layer_source=a.layer_records or "",
        prefer=prefer,
        forward_q=a.forward_q,
        moe_dp_chunk=a.moe_dp_chunk,
        request_attention=not a.no_request_attention,
        step_indexer=a.step_indexer,
        step_keys=a.step_keys,
        overlap=a.overlap,
        dbo_threshold=parse_dbo_threshold(a.dbo_threshold),
        verify_attention=a.verify_attention,
        eager_us_per_layer=a.eager_us_per_layer,
        block_pool=pool,
        attention_kernels=a.attention_kernels,
    )
    if a.backend:
        prof_.provenance["backend"] = a.backend
    save_profile(prof_, a.out)
    print(f"wrote {a.out}: {prof_.label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
