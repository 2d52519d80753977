"""Step-cost profiles: the format (``Profile``, ``Table``; the attention sections are
dsim.cost.attention's), reading and checking a profile file (``profile_from_dict``, ``load_profile``:
errors name the file, line and field), writing one (``profile_to_dict``, ``save_profile``;
``upgrade_profile_file`` rewrites an older format's file in the current one) and where
the shipped profiles live (``PROFILE_DIR``, ``resolve_profile_path``).

The format, one field a line: docs/dev/profile-format.md. This module reads the current format
only: a file of an older one is upgraded first (dsim.cost.profile_upgrade, the one place that knows
them). How the formats came to be and what each of their terms prices (the "module doc" the
comments below cite): docs/dev/profile-format-history.md."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from dsim.cost.attention import (
    ATTENTION_COEF_FIELDS,
    ATTENTION_OCC_FIELDS,
    ATTENTION_OPTIONAL_FIELDS,
    ATTENTION_SPLIT_FIELDS,
    AttentionTerms,
    BlockPool,
    BlockPoolKind,
    PrefillTerms,
    RequestAttention,
    StepKeyKind,
    StepKeys,
    prefill_discount_bound_ms_per_ktok,
)
from dsim.cost.profile_upgrade import FORMAT_VERSION, source_format_version, upgrade_profile
from dsim.errors import InputError, plain

if TYPE_CHECKING:
    from dsim.schema import Doc


PROVENANCE_FIELDS = ("kind", "hardware", "gpus_per_replica", "model", "engine", "engine_version", "date", "method")
DRAFT_KINDS = ("mtp", "eagle3", "block", "dspark")
# "dspark@K": the DSpark drafter over K positions per request (a fixed length K shorter than the
# profile's draft block; vLLM's DSpark proposer drafts batch x num_speculative_tokens positions)
DRAFT_LENGTH_KINDS = tuple(f"dspark@{k}" for k in range(1, 17))

# measured: our own measurements; silicon-table: composed from published per-kernel silicon tables
# (e.g. NVIDIA AIConfigurator's); analytical: a roofline model; calibrated: fitted to measured runs;
# derived: another profile mapped by a stated transform (provenance.derived_from names it)
PROFILE_KINDS = ("measured", "silicon-table", "analytical", "calibrated", "derived")
KV_BLOCK_TOKENS = 16
DENSE_TOKENS = 16384  # forward cost tabulated densely up to this many tokens per step


def vllm_capture_sizes(max_capture: int = 512) -> list[int]:
    """vLLM's default CUDA-graph capture sizes: 1, 2, 4, multiples of 8 to 256, of 16 above."""
    sizes = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, max_capture + 1, 16))
    return [s for s in sizes if s <= max_capture]


def drafter_request_sizes(max_capture: int = 512, max_requests: int = 1024) -> list[int]:
    """Request counts a drafter's cost table is keyed by: vLLM's capture sizes up to max_capture
    (a drafter's batch is padded to the next one, as the target's), then every 128 requests up to
    max_requests. ``CostModel.draft_table_ms`` reads the next size at or above, so on this grid a
    drafter pays its padded batch, not the next power of two."""
    caps = vllm_capture_sizes(max_capture)
    top = caps[-1] if caps else 0
    return caps + list(range(top + 128, max_requests + 1, 128))


@dataclass(frozen=True)
class Table:
    """A cost table: x strictly increasing, ms the cost at each x."""

    x: np.ndarray
    ms: np.ndarray


PREFILL_V2_KEYS = (
    "version",
    "cached_ms_per_mpair",
    "within_ms_per_mpair",
    "token_ms_per_ktok",
    "ms_per_chunk",
    "ms_per_step",
    "own_keys_tokens",
)


@dataclass(frozen=True)
class Profile:
    name: str
    provenance: dict
    kv_cache_gib: float
    kv_bytes_per_token: float
    cpu_overhead_ms: float
    capture_sizes: tuple
    forward: Table
    kv_ms_per_ktok: float
    draft: dict = field(default_factory=dict)  # kind -> Table keyed by request count
    prefill_discount_ms_per_ktok: float = 0.0  # prefill_terms.discount_ms_per_ktok (see module doc)
    prefill_attn_ms_per_mpair: float = 0.0  # prefill_terms.attention_ms_per_mpair
    prefill_ms_per_chunk: float = 0.0  # prefill_terms.ms_per_chunk
    prefill_v2: PrefillTerms | None = None  # prefill_terms version 2 (replaces the three above)
    source_path: str = ""
    extra: dict = field(default_factory=dict)  # other keys kept for provenance (fit errors...)
    max_model_len: int | None = None  # longest prompt + output (None: not limited)
    # the format of the file it was read from (an older one is upgraded on read, dsim.cost.profile_upgrade);
    # built in code: the oldest format that holds its sections. Written always in the current format.
    format_version: int = FORMAT_VERSION
    attention: AttentionTerms | None = None  # format 2: per-request attention terms
    request_attention: RequestAttention | None = None  # format 3: per-request attention table

    @property
    def gpus_per_replica(self) -> int:
        return int(self.provenance.get("gpus_per_replica", 1))

    @property
    def kv_capacity_blocks(self) -> int:
        return int(self.kv_cache_gib * 2**30 // (self.kv_bytes_per_token * KV_BLOCK_TOKENS))

    @property
    def label(self) -> str:
        """One line saying what this profile is and how it was obtained."""
        p = self.provenance
        return (
            f"{self.name} [{p.get('kind')}] {p.get('model')} on {p.get('hardware')} "
            f"x{p.get('gpus_per_replica')} ({p.get('method')}, {p.get('date')})"
        )


MAX_STEP_TOKENS = 10_000_000  # a table's token / request sizes
MAX_COST_MS = 1e6  # any one cost (ms): more is not a step of an engine
MAX_KV_CACHE_GIB = 1e6  # a replica's KV cache (a PiB)
MAX_GPUS_PER_REPLICA = 4096
MAX_MODEL_LEN = 100_000_000


def _table(raw, doc, keys: tuple, xkey: str) -> Table:
    from dsim import schema as S

    S.mapping(raw, doc, *keys, required=(xkey, "ms"))
    x = S.number_list(raw[xkey], doc, *keys, xkey, lo=1, hi=MAX_STEP_TOKENS, ints=True, increasing=True)
    ms = S.number_list(raw["ms"], doc, *keys, "ms", lo=0, hi=MAX_COST_MS)
    if len(x) != len(ms):
        raise InputError(f"{doc.at(*keys, 'ms')}: has {len(ms)} values, {xkey} has {len(x)} (one cost per size)")
    return Table(np.asarray(x, dtype=np.float64), np.asarray(ms, dtype=np.float64))


def profile_from_dict(d: dict, path: str = "<profile>", doc: Doc | None = None) -> Profile:
    """Validate a parsed profile of any supported format; raise InputError naming the file, line
    (when ``doc`` carries the file's line marks, as load_profile's does), field and bad value, one
    field at a time. An older format is upgraded first (dsim.cost.profile_upgrade, which refuses
    a section the file's format_version did not allow); what follows reads the current format."""
    from dsim import schema as S

    doc = doc if doc is not None else S.Doc(str(path))
    if not isinstance(d, dict):
        raise InputError(f"{doc.at()}: not a mapping (a profile has name, provenance, memory, ...)")
    source_version = source_format_version(d, doc)
    d = upgrade_profile(d, doc)
    for key in ("name", "provenance", "memory", "capture_sizes", "forward", "kv_ms_per_ktok", "cpu_overhead_ms"):
        if key not in d:
            raise InputError(f"{doc.at()}: missing field '{key}'")
    name = S.text(d["name"], doc, "name")
    prov = S.mapping(d["provenance"], doc, "provenance", required=PROVENANCE_FIELDS)
    if prov["kind"] not in PROFILE_KINDS:
        raise InputError(
            f"{doc.at('provenance', 'kind')}: must be {', '.join(PROFILE_KINDS[:-1])} or {PROFILE_KINDS[-1]}, "
            f"got {plain(prov['kind'])}"
        )
    gpr = S.integer(prov["gpus_per_replica"], doc, "provenance", "gpus_per_replica", lo=1, hi=MAX_GPUS_PER_REPLICA)
    prov = dict(prov, gpus_per_replica=gpr)
    mem = S.mapping(d["memory"], doc, "memory", required=("kv_cache_gib", "kv_bytes_per_token"))
    kv_gib = S.number(mem["kv_cache_gib"], doc, "memory", "kv_cache_gib", lo=0, lo_open=True, hi=MAX_KV_CACHE_GIB)
    kv_bpt = S.number(mem["kv_bytes_per_token"], doc, "memory", "kv_bytes_per_token", lo=1)
    caps = S.number_list(d["capture_sizes"], doc, "capture_sizes", lo=1, hi=MAX_STEP_TOKENS, ints=True, increasing=True)
    fwd = _table(d["forward"], doc, ("forward",), "tokens")
    missing = sorted(set(caps) - set(fwd.x.astype(int).tolist()))
    if missing:
        raise InputError(f"{doc.at('forward', 'tokens')}: capture sizes {missing[:5]} not profiled")
    draft = {}
    raw_draft = d.get("draft")
    if raw_draft is not None:
        S.mapping(raw_draft, doc, "draft")
        for kind, raw in raw_draft.items():
            if kind not in DRAFT_KINDS and kind not in DRAFT_LENGTH_KINDS:
                raise InputError(
                    f"{doc.at('draft', kind)}: unknown draft kind (known: {', '.join(DRAFT_KINDS)}, dspark@K)"
                )
            draft[kind] = _table(raw, doc, ("draft", kind), "requests")
    kv_slope = S.number(d["kv_ms_per_ktok"], doc, "kv_ms_per_ktok", lo=0, hi=MAX_COST_MS)
    cpu = S.number(d["cpu_overhead_ms"], doc, "cpu_overhead_ms", lo=0, hi=MAX_COST_MS)
    max_len = None
    if d.get("max_model_len") is not None:
        max_len = S.integer(d["max_model_len"], doc, "max_model_len", lo=1, hi=MAX_MODEL_LEN)
    elif prov.get("max_model_len") is not None:
        max_len = S.integer(prov["max_model_len"], doc, "provenance", "max_model_len", lo=1, hi=MAX_MODEL_LEN)
    else:
        max_len, src = model_context(prov.get("model"))
        if max_len is not None:
            prov = dict(prov, max_model_len_source=src)
    disc, attn, per_chunk, prefill_v2 = _prefill_terms(d.get("prefill_terms"), doc)
    attention = _attention_terms(d["attention"], doc) if d.get("attention") is not None else None
    request_attention = None
    if d.get("request_attention") is not None:
        request_attention = _request_attention_table(d["request_attention"], doc, len(fwd.x))
    if (
        prefill_v2 is not None
        and prefill_v2.own_keys_tokens
        and (request_attention is None or not request_attention.step_keys)
    ):
        raise InputError(f"{doc.at('prefill_terms', 'own_keys_tokens')}: needs request_attention.step_keys (format 4)")
    bound, bound_key = disc, "discount_ms_per_ktok"
    if prefill_v2 is not None:
        bound, bound_key = prefill_discount_bound_ms_per_ktok(prefill_v2, request_attention), "token_ms_per_ktok"
    # A prompt token's discount cannot exceed what the table charges a token: at every size the
    # forward cost must cover n discounted tokens (else a prefill step would cost less than nothing).
    bad = np.flatnonzero(fwd.ms < bound * fwd.x / 1000.0 - 1e-9)
    if len(bad):
        i = int(bad[0])
        what = (
            f"{bound:g}"
            if prefill_v2 is None
            else f"{prefill_v2.token_ms_per_ktok:g} (a prompt token {bound:g} ms per 1000 below a decode token)"
        )
        raise InputError(
            f"{doc.at('prefill_terms', bound_key)} {what}: exceeds forward.ms[{i}] "
            f"= {fwd.ms[i]:g} ms for {int(fwd.x[i])} tokens (inconsistent profile)"
        )
    known = {
        "name",
        "provenance",
        "memory",
        "capture_sizes",
        "forward",
        "kv_ms_per_ktok",
        "cpu_overhead_ms",
        "draft",
        "prefill_terms",
        "max_model_len",
        "format_version",
        "attention",
        "request_attention",
    }
    return Profile(
        name=name,
        provenance=prov,
        kv_cache_gib=kv_gib,
        kv_bytes_per_token=kv_bpt,
        cpu_overhead_ms=cpu,
        capture_sizes=tuple(caps),
        forward=fwd,
        kv_ms_per_ktok=kv_slope,
        draft=draft,
        prefill_discount_ms_per_ktok=disc,
        prefill_attn_ms_per_mpair=attn,
        prefill_ms_per_chunk=per_chunk,
        prefill_v2=prefill_v2,
        source_path=str(path),
        extra={k: v for k, v in d.items() if k not in known},
        max_model_len=max_len,
        format_version=source_version,
        attention=attention,
        request_attention=request_attention,
    )


REQUEST_ATTENTION_KEYS = ("batch", "q", "ctx", "step_ms", "forward_share_ms")


def _request_attention_table(raw: Any, doc: Any, n_forward: int) -> RequestAttention:
    from dsim import schema as S

    S.mapping(raw, doc, "request_attention", required=REQUEST_ATTENTION_KEYS)
    unknown = sorted(set(raw) - set(REQUEST_ATTENTION_KEYS) - {"source", "step_indexer", "step_keys", "block_pool"})
    if unknown:
        raise InputError(
            f"{doc.at('request_attention', unknown[0])}: unknown field (known: {', '.join(REQUEST_ATTENTION_KEYS)}, source, step_indexer, step_keys, block_pool)"
        )
    axes = {}
    for k, lo in (("batch", 1), ("q", 1), ("ctx", 0)):
        axes[k] = np.asarray(
            S.number_list(raw[k], doc, "request_attention", k, lo=lo, hi=MAX_MODEL_LEN, ints=True, increasing=True),
            dtype=np.int64,
        )
    shape = (len(axes["batch"]), len(axes["q"]), len(axes["ctx"]))
    rows = raw["step_ms"]
    if not isinstance(rows, list) or len(rows) != shape[0]:
        raise InputError(f"{doc.at('request_attention', 'step_ms')}: {shape[0]} rows (one per batch) of q x ctx costs")
    tab = np.empty(shape)
    for b, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != shape[1]:
            raise InputError(f"{doc.at('request_attention', 'step_ms', b)}: {shape[1]} rows (one per q) of ctx costs")
        for j, cell in enumerate(row):
            v = S.number_list(cell, doc, "request_attention", "step_ms", b, j, lo=0, hi=MAX_COST_MS)
            if len(v) != shape[2]:
                raise InputError(
                    f"{doc.at('request_attention', 'step_ms', b, j)}: has {len(v)} values, ctx has {shape[2]}"
                )
            tab[b, j] = v
    share = S.number_list(raw["forward_share_ms"], doc, "request_attention", "forward_share_ms", lo=0, hi=MAX_COST_MS)
    if len(share) != n_forward:
        raise InputError(
            f"{doc.at('request_attention', 'forward_share_ms')}: has {len(share)} values, forward.tokens has {n_forward}"
        )
    src = raw.get("source", "")
    ratio, mcell = 0, 0.0
    if raw.get("step_indexer") is not None:
        si = raw["step_indexer"]
        S.mapping(si, doc, "request_attention", "step_indexer", required=("ratio", "ms_per_mcell"))
        extra = sorted(set(si) - {"ratio", "ms_per_mcell"})
        if extra:
            raise InputError(
                f"{doc.at('request_attention', 'step_indexer', extra[0])}: unknown field (known: ratio, ms_per_mcell)"
            )
        ratio = S.integer(si["ratio"], doc, "request_attention", "step_indexer", "ratio", lo=1, hi=MAX_MODEL_LEN)
        mcell = S.number(
            si["ms_per_mcell"], doc, "request_attention", "step_indexer", "ms_per_mcell", lo=0, hi=MAX_COST_MS
        )
    return RequestAttention(
        axes["batch"],
        axes["q"],
        axes["ctx"],
        tab,
        np.asarray(share, dtype=np.float64),
        str(src) if src else "",
        indexer_ratio=int(ratio),
        indexer_ms_per_mcell=float(mcell),
        step_keys=_step_keys(raw["step_keys"], doc) if raw.get("step_keys") is not None else None,
        block_pool=_block_pool(raw["block_pool"], doc) if raw.get("block_pool") is not None else None,
    )


def priced_from_q(ratio: int, q_grid, ctx_grid) -> int:
    """The smallest q of the per-request table at which every record's requests complete a block of
    ``ratio`` (their c + q crosses a multiple of it at every table context), 0 if none does: the
    records from that q on already carry the pooling (module doc, format 5)."""
    for q in q_grid:
        if all((int(c) + int(q)) // ratio > int(c) // ratio for c in ctx_grid):
            return int(q)
    return 0


def _kind_entries(raw: Any, doc: Any, at: tuple, fields: tuple, what: str) -> list[tuple[int, dict]]:
    """(index, mapping) of a term's non-empty ``kinds`` list, each entry holding exactly ``fields``."""
    from dsim import schema as S

    kinds_raw = raw["kinds"]
    if not isinstance(kinds_raw, list) or not kinds_raw:
        raise InputError(f"{doc.at(*at, 'kinds')}: must be a non-empty list of {what}")
    for i, kr in enumerate(kinds_raw):
        S.mapping(kr, doc, *at, "kinds", i, required=fields)
        extra = sorted(set(kr) - set(fields))
        if extra:
            raise InputError(f"{doc.at(*at, 'kinds', i, extra[0])}: unknown field (known: {', '.join(fields)})")
    return list(enumerate(kinds_raw))


BLOCK_POOL_KIND_FIELDS = ("ratio", "layers", "ms_per_step", "ms_per_block", "priced_from_q")


def _block_pool(raw: Any, doc: Any) -> BlockPool:
    from dsim import schema as S

    at = ("request_attention", "block_pool")
    S.mapping(raw, doc, *at, required=("kinds",))
    extra = sorted(set(raw) - {"kinds", "source"})
    if extra:
        raise InputError(f"{doc.at(*at, extra[0])}: unknown field (known: kinds, source)")
    kinds = []
    for i, kr in _kind_entries(raw, doc, at, BLOCK_POOL_KIND_FIELDS, "compression ratios"):
        kinds.append(
            BlockPoolKind(
                ratio=S.integer(kr["ratio"], doc, *at, "kinds", i, "ratio", lo=1, hi=MAX_MODEL_LEN),
                layers=S.integer(kr["layers"], doc, *at, "kinds", i, "layers", lo=0, hi=100000),
                ms_per_step=S.number(kr["ms_per_step"], doc, *at, "kinds", i, "ms_per_step", lo=0, hi=MAX_COST_MS),
                ms_per_block=S.number(kr["ms_per_block"], doc, *at, "kinds", i, "ms_per_block", lo=0, hi=MAX_COST_MS),
                priced_from_q=S.integer(
                    kr["priced_from_q"], doc, *at, "kinds", i, "priced_from_q", lo=0, hi=MAX_MODEL_LEN
                ),
            )
        )
    ratios = [k.ratio for k in kinds]
    if len(set(ratios)) != len(ratios):
        raise InputError(f"{doc.at(*at, 'kinds')}: ratio {ratios} repeats a compression ratio")
    src = raw.get("source", "")
    return BlockPool(kinds=tuple(kinds), source=str(src) if src else "")


STEP_KEYS_FIELDS = ("programs", "block", "min_chunk", "combine_ms_per_work", "kinds")
STEP_KEY_KIND_FIELDS = ("layers", "ratio", "cap", "window", "ms_per_mcell")


def _step_keys(raw: Any, doc: Any) -> StepKeys:
    from dsim import schema as S

    at = ("request_attention", "step_keys")
    S.mapping(raw, doc, *at, required=STEP_KEYS_FIELDS)
    extra = sorted(set(raw) - set(STEP_KEYS_FIELDS))
    if extra:
        raise InputError(f"{doc.at(*at, extra[0])}: unknown field (known: {', '.join(STEP_KEYS_FIELDS)})")
    kinds = []
    for i, kr in _kind_entries(raw, doc, at, STEP_KEY_KIND_FIELDS, "attention kinds"):
        kinds.append(
            StepKeyKind(
                layers=S.integer(kr["layers"], doc, *at, "kinds", i, "layers", lo=0, hi=100000),
                ratio=S.integer(kr["ratio"], doc, *at, "kinds", i, "ratio", lo=0, hi=MAX_MODEL_LEN),
                cap=S.integer(kr["cap"], doc, *at, "kinds", i, "cap", lo=0, hi=MAX_MODEL_LEN),
                window=S.integer(kr["window"], doc, *at, "kinds", i, "window", lo=0, hi=MAX_MODEL_LEN),
                ms_per_mcell=S.number(kr["ms_per_mcell"], doc, *at, "kinds", i, "ms_per_mcell", lo=0, hi=MAX_COST_MS),
            )
        )
    return StepKeys(
        programs=S.integer(raw["programs"], doc, *at, "programs", lo=1, hi=10**7),
        block=S.integer(raw["block"], doc, *at, "block", lo=1, hi=MAX_MODEL_LEN),
        min_chunk=S.integer(raw["min_chunk"], doc, *at, "min_chunk", lo=1, hi=MAX_MODEL_LEN),
        combine_ms_per_work=S.number(raw["combine_ms_per_work"], doc, *at, "combine_ms_per_work", lo=0, hi=MAX_COST_MS),
        kinds=tuple(kinds),
    )


def _attention_terms(raw: Any, doc: Any) -> AttentionTerms:
    from dsim import schema as S

    fields = ATTENTION_SPLIT_FIELDS + ATTENTION_OCC_FIELDS + ATTENTION_COEF_FIELDS
    S.mapping(raw, doc, "attention", required=fields)
    fields = fields + ATTENTION_OPTIONAL_FIELDS
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise InputError(f"{doc.at('attention', unknown[0])}: unknown field (known: {', '.join(fields)})")
    v: dict[str, Any] = {}
    for k in ("query_heads", "kv_heads", "sms", "min_chunk", "block_rows") + ATTENTION_OCC_FIELDS:
        v[k] = S.integer(raw[k], doc, "attention", k, lo=1, hi=1 << 20)
    v["fill"] = S.number(raw["fill"], doc, "attention", "fill", lo=0, lo_open=True, hi=1e3)
    v["balance"] = S.number(raw["balance"], doc, "attention", "balance", lo=0, hi=1e3)
    for k in ATTENTION_COEF_FIELDS:
        v[k] = S.number(raw[k], doc, "attention", k, lo=0, hi=MAX_COST_MS)
    for k in ATTENTION_OPTIONAL_FIELDS:
        if k in raw:
            v[k] = S.number(raw[k], doc, "attention", k, lo=0, hi=MAX_COST_MS)
    if v["query_heads"] % v["kv_heads"]:
        raise InputError(f"{doc.at('attention', 'kv_heads')}: {v['kv_heads']} does not divide query_heads")
    return AttentionTerms(**v)


PREFILL_KEYS = ("discount_ms_per_ktok", "attention_ms_per_mpair", "ms_per_chunk")


def _prefill_terms(raw, doc) -> tuple[float, float, float, PrefillTerms | None]:
    """(discount, pair attention, per chunk) of form 1 (no ``version``), or form 2's PrefillTerms
    (``version: 2``); 0s and None without. Two forms of the current format, neither older: form 1
    has no exact equivalent in form 2 (dsim.cost.profile_upgrade)."""
    from dsim import schema as S

    if raw is None:
        return 0.0, 0.0, 0.0, None
    if isinstance(raw, dict) and "version" in raw:
        ver = S.integer(raw["version"], doc, "prefill_terms", "version", lo=2, hi=2)
        if set(raw) - set(PREFILL_V2_KEYS):
            bad = sorted(set(raw) - set(PREFILL_V2_KEYS))[0]
            raise InputError(
                f"{doc.at('prefill_terms', bad)}: not a version-{ver} key (known: {', '.join(PREFILL_V2_KEYS)})"
            )
        v = {
            key: S.number(raw.get(key, 0.0), doc, "prefill_terms", key, lo=0, hi=MAX_COST_MS)
            for key in ("cached_ms_per_mpair", "within_ms_per_mpair", "ms_per_chunk", "ms_per_step")
        }
        tok = S.number(
            raw.get("token_ms_per_ktok", 0.0),
            doc,
            "prefill_terms",
            "token_ms_per_ktok",
            lo=-MAX_COST_MS,
            hi=MAX_COST_MS,
        )
        own = S.integer(
            raw.get("own_keys_tokens", 0), doc, "prefill_terms", "own_keys_tokens", lo=0, hi=MAX_STEP_TOKENS
        )
        return 0.0, 0.0, 0.0, PrefillTerms(token_ms_per_ktok=tok, own_keys_tokens=own, **v)
    if not isinstance(raw, dict) or set(raw) - set(PREFILL_KEYS):
        raise InputError(
            f"{doc.at('prefill_terms')}: a mapping of {', '.join(PREFILL_KEYS)} (or version: 2 and its keys)"
        )
    disc, attn, chunk = (
        S.number(raw.get(key, 0.0), doc, "prefill_terms", key, lo=0, hi=MAX_COST_MS) for key in PREFILL_KEYS
    )
    return disc, attn, chunk, None


def profile_to_dict(p: Profile) -> dict:
    d = {
        "name": p.name,
        "provenance": dict(p.provenance),
        "memory": {"kv_cache_gib": float(p.kv_cache_gib), "kv_bytes_per_token": float(p.kv_bytes_per_token)},
        "cpu_overhead_ms": float(p.cpu_overhead_ms),
        "capture_sizes": [int(c) for c in p.capture_sizes],
        "forward": {"tokens": [int(x) for x in p.forward.x], "ms": [round(float(v), 5) for v in p.forward.ms]},
        "kv_ms_per_ktok": float(p.kv_ms_per_ktok),
    }
    if p.max_model_len is not None:
        d["max_model_len"] = int(p.max_model_len)
    if p.prefill_discount_ms_per_ktok or p.prefill_attn_ms_per_mpair or p.prefill_ms_per_chunk:
        d["prefill_terms"] = {
            "discount_ms_per_ktok": float(p.prefill_discount_ms_per_ktok),
            "attention_ms_per_mpair": float(p.prefill_attn_ms_per_mpair),
        }
        if p.prefill_ms_per_chunk:
            d["prefill_terms"]["ms_per_chunk"] = float(p.prefill_ms_per_chunk)
    if p.prefill_v2 is not None:
        t = p.prefill_v2
        d["prefill_terms"] = {"version": 2}
        for key in PREFILL_V2_KEYS[1:]:
            v = getattr(t, key)
            if v:
                d["prefill_terms"][key] = int(v) if key == "own_keys_tokens" else round(float(v), 6)
    d["format_version"] = FORMAT_VERSION  # written in the current format whatever it was read from
    if p.attention is not None:
        d["attention"] = {k: getattr(p.attention, k) for k in ATTENTION_SPLIT_FIELDS + ATTENTION_OCC_FIELDS}
        d["attention"].update({k: float(getattr(p.attention, k)) for k in ATTENTION_COEF_FIELDS})
        d["attention"].update(
            {k: float(getattr(p.attention, k)) for k in ATTENTION_OPTIONAL_FIELDS if getattr(p.attention, k)}
        )
    if p.request_attention is not None:
        ra = p.request_attention
        d["request_attention"] = {
            "batch": [int(x) for x in ra.batch],
            "q": [int(x) for x in ra.q],
            "ctx": [int(x) for x in ra.ctx],
            "step_ms": [[[round(float(v), 5) for v in cell] for cell in row] for row in ra.step_ms],
            "forward_share_ms": [round(float(v), 5) for v in ra.forward_share_ms],
        }
        if ra.source:
            d["request_attention"]["source"] = ra.source
        if ra.indexer_ratio:
            d["request_attention"]["step_indexer"] = {
                "ratio": int(ra.indexer_ratio),
                "ms_per_mcell": float(ra.indexer_ms_per_mcell),
            }
        if ra.step_keys:
            sk = ra.step_keys
            d["request_attention"]["step_keys"] = {
                "programs": int(sk.programs),
                "block": int(sk.block),
                "min_chunk": int(sk.min_chunk),
                "combine_ms_per_work": float(sk.combine_ms_per_work),
                "kinds": [
                    {
                        f: (float(getattr(k, f)) if f == "ms_per_mcell" else int(getattr(k, f)))
                        for f in STEP_KEY_KIND_FIELDS
                    }
                    for k in sk.kinds
                ],
            }
    if p.request_attention is not None and p.request_attention.block_pool is not None:
        bp = p.request_attention.block_pool
        d["request_attention"]["block_pool"] = {
            "kinds": [
                {
                    f: (round(float(getattr(k, f)), 5) if f.startswith("ms_") else int(getattr(k, f)))
                    for f in BLOCK_POOL_KIND_FIELDS
                }
                for k in bp.kinds
            ]
        }
        if bp.source:
            d["request_attention"]["block_pool"]["source"] = bp.source
    if p.draft:
        d["draft"] = {
            k: {"requests": [int(x) for x in t.x], "ms": [round(float(v), 5) for v in t.ms]} for k, t in p.draft.items()
        }
    d.update(p.extra)
    return d


def save_profile(p: Profile, path: str | Path, what: str = "--out") -> None:
    """Write whole or not at all, never over anything but a regular file (dsim.outputs)."""
    from dsim.outputs import write_file

    write_file(path, yaml.safe_dump(profile_to_dict(p), sort_keys=False, width=120), what)


def upgrade_profile_file(path: str | Path, out: str | Path, what: str = "--out") -> int:
    """``dsim profile upgrade``: the profile at ``path`` in the current format, checked to load
    (profile_from_dict), ``{from_format_version, to_format_version, by, date}`` (today, UTC)
    appended to ``provenance.format_upgrades``, written to ``out`` whole or not at all (JSON where
    ``out`` ends in .json, else YAML as save_profile writes). Returns the format it came from; a
    file already current is not written. InputError (one line, nothing written) for a file that
    does not read, is inconsistent or would not load."""
    from datetime import datetime, timezone

    from dsim import schema as S
    from dsim.cost.profile_upgrade import upgrade_note
    from dsim.outputs import check_file_target, write_file

    src = Path(path)
    check_file_target(out, what)
    raw, doc = S.read_document(src, kind="json" if src.suffix.lower() == ".json" else "yaml")
    version = source_format_version(raw, doc)
    d = upgrade_profile(raw, doc)
    profile_from_dict(d, str(src), doc)
    if version == FORMAT_VERSION:
        return version
    prov = d["provenance"]  # a mapping: profile_from_dict checked it
    notes = prov.get("format_upgrades") or []
    if not isinstance(notes, list):
        raise InputError(f"{doc.at('provenance', 'format_upgrades')}: must be a list (one entry per upgrade)")
    note = upgrade_note(version, datetime.now(timezone.utc).date().isoformat())
    d = dict(d, provenance=dict(prov, format_upgrades=[*notes, note]))
    if Path(out).suffix.lower() == ".json":
        text = json.dumps(d, indent=1) + "\n"
    else:
        text = yaml.safe_dump(d, sort_keys=False, width=120)
    write_file(out, text, what)
    return version


def _profile_dir() -> Path:
    """profiles/ of the source checkout dsim runs from, else the copy installed as dsim/profiles."""
    here = Path(__file__).resolve().parents[1]  # the dsim package
    if (here.parent / "pyproject.toml").is_file() and (here.parent / "profiles").is_dir():
        return here.parent / "profiles"
    return here / "profiles"


PROFILE_DIR = _profile_dir()
DEFAULT_PROFILE = "deepseek-v4-flash-h200-dp8-ep8"


def resolve_profile_path(name_or_path: str) -> Path:
    """A YAML path, a shipped profile's name, or a model name (llama-3.1-8b, qwen3-8b, ...): the
    measured H200 profile of that model where one exists, else its analytical one (the fallback)."""
    s = str(name_or_path)
    if not s.strip():
        raise InputError("--profile: empty (a profile name or a .yaml path)")
    p = Path(s).expanduser()
    pathlike = p.suffix.lower() in (".yaml", ".yml", ".json") or "/" in s or "\\" in s
    if not pathlike:
        for stem in (s, f"h200-{s}", f"analytical-{s}-h200x1"):
            for cand in sorted(PROFILE_DIR.rglob(f"{stem}.yaml")):
                if "models" not in cand.parts:
                    return cand
    if p.is_dir():
        raise InputError(f"{p}: is a directory, not a profile file")
    if p.is_file():
        return p
    if pathlike:
        raise InputError(f"{p}: profile file not found")
    known = sorted(q.stem for q in PROFILE_DIR.rglob("*.yaml") if "models" not in q.parts)
    raise InputError(f"{s}: profile not found (a .yaml path or one of: {', '.join(known)})")


def load_profile(name_or_path: str | None = None) -> Profile:
    """A validated profile by name or path; its max_model_len defaults to the profile's
    provenance.max_model_len, else none (requests limited by the KV cache only)."""
    from dsim import schema as S

    path = resolve_profile_path(DEFAULT_PROFILE if name_or_path is None else name_or_path)
    d, doc = S.read_document(path, kind="json" if path.suffix.lower() == ".json" else "yaml")
    return profile_from_dict(d, str(path), doc)


@functools.lru_cache(maxsize=64)
def model_context(model: Any) -> tuple[int | None, str]:
    """(max_model_len, where it came from) for a profile that carries none: the model config's
    max_position_embeddings (profiles/models/MODEL.json), what vLLM takes as max_model_len when
    it is not given. (None, "") for a model without a shipped config."""
    from dsim.profiling.models import MODEL_DIR

    if not isinstance(model, str) or not model or "/" in model or model.startswith("."):
        return None, ""
    p = MODEL_DIR / f"{model}.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8")) if p.is_file() and p.stat().st_size < 1 << 20 else None
    except (OSError, ValueError):
        return None, ""
    n = cfg.get("max_position_embeddings") if isinstance(cfg, dict) else None
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_MODEL_LEN:
        return None, ""
    return n, (
        f"max_position_embeddings of profiles/models/{model}.json (the profile carries no max_model_len; "
        "vLLM's default)"
    )
