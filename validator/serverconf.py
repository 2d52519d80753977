"""The server's configuration as a measurement records it: engine kind and the flags that shape
its steps (prefix caching, ``--max-num-seqs``, ``--max-num-batched-tokens``, the speculative
config's method and K), each with where it came from.

Three sources, in this order of trust:

- **queried** (:func:`queried`): what the server says about itself. ``/v1/models`` (vLLM answers
  ``owned_by: "vllm"``), ``/version``, and ``/metrics``: ``vllm:cache_config_info`` carries the
  cache's settings as labels (``enable_prefix_caching``, ``block_size``), and the spec-decode
  counters exist only on a speculative server, one ``num_accepted_tokens_per_pos`` series per
  draft position (so their count is K). vLLM does not publish ``--max-num-seqs``,
  ``--max-num-batched-tokens`` or the speculative method.
- **told** (:func:`from_flags`): the server's command line, as ``run --server-flags`` gives it or
  as ``serve`` / ``--launch`` started it: vLLM's own flag names.
- **vLLM's defaults**, stated as assumptions where neither says (``check`` prints them).

Where the server's own answer and the flags disagree the server wins, and the disagreement is
kept (``conflicts``) and printed: a flag string typed by hand can be stale.
"""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Any

from validator import promtext

if TYPE_CHECKING:
    from validator.measure import Measurement

CACHE_INFO = "vllm:cache_config_info"
FIELDS = ("kind", "prefix_caching", "block_size", "max_num_seqs", "max_num_batched_tokens", "spec_method", "spec_k")


def _tokens(flags: str | list | None) -> list[str]:
    if not flags:
        return []
    if isinstance(flags, (list, tuple)):
        return [str(a) for a in flags]
    try:
        return shlex.split(str(flags))
    except ValueError:
        return str(flags).split()


def _value(toks: list[str], flag: str) -> str | None:
    """The value of ``flag`` (``--f V`` or ``--f=V``); the last one given wins, as in argparse."""
    out = None
    for i, a in enumerate(toks):
        if a == flag and i + 1 < len(toks):
            out = toks[i + 1]
        elif a.startswith(flag + "="):
            out = a.split("=", 1)[1]
    return out


def _int(v: Any, what: str) -> int | None:
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        from dsim.errors import InputError

        raise InputError(f"server flags: {what} must be an integer, got {v!r}") from None


def from_flags(flags: str | list | None) -> dict:
    """The settings a vLLM command line states ({field: value}; only those it states).
    ``--speculative-config`` as JSON or in vLLM's dotted form (``--speculative-config.method``);
    the speculative config's ``num_speculative_tokens`` is K."""
    toks = _tokens(flags)
    out: dict[str, Any] = {}
    if not toks:
        return out
    for name, flag in (
        ("max_num_seqs", "--max-num-seqs"),
        ("max_num_batched_tokens", "--max-num-batched-tokens"),
        ("block_size", "--block-size"),
    ):
        v = _value(toks, flag)
        if v is not None:
            out[name] = _int(v, flag)
    pc = [a for a in toks if a in ("--enable-prefix-caching", "--no-enable-prefix-caching")]
    if pc:
        out["prefix_caching"] = pc[-1] == "--enable-prefix-caching"
    sc = _value(toks, "--speculative-config")
    if sc is not None:
        try:
            doc = json.loads(sc)
        except ValueError:
            from dsim.errors import InputError

            raise InputError(f"server flags: --speculative-config is not JSON: {sc!r}") from None
        if isinstance(doc, dict):
            if doc.get("method") or doc.get("model"):
                out["spec_method"] = str(doc.get("method") or "draft_model")
            if doc.get("num_speculative_tokens") is not None:
                out["spec_k"] = _int(doc["num_speculative_tokens"], "num_speculative_tokens")
    m = _value(toks, "--speculative-config.method")
    if m is not None:
        out["spec_method"] = m
    k = _value(toks, "--speculative-config.num_speculative_tokens")
    if k is not None:
        out["spec_k"] = _int(k, "--speculative-config.num_speculative_tokens")
    if out.get("spec_k") == 0:
        out.pop("spec_method", None)
    if any("vllm_entry.py" in a or "vllm-venv" in a for a in toks):
        out["kind"] = "vllm-cpu"
    elif len(toks) > 1 and toks[0].endswith("vllm") and toks[1] == "serve":
        out["kind"] = "vllm"
    return out


def _truth(v: str | None) -> bool | None:
    if v is None:
        return None
    s = v.strip().lower()
    return True if s == "true" else False if s == "false" else None


def queried(models: dict | None, version: str | None, metrics: dict | None) -> dict:
    """What the server says about itself ({field: value}; only what it says). ``models``: the
    ``/v1/models`` answer; ``metrics``: parsed ``/metrics`` (promtext.parse), None when absent."""
    out: dict[str, Any] = {}
    data = (models or {}).get("data") or []
    owned = data[0].get("owned_by") if data and isinstance(data[0], dict) else None
    cache = (metrics or {}).get(CACHE_INFO) or {}
    if owned == "vllm" or cache:
        out["kind"] = "vllm"
    if version:
        out["version"] = str(version)
    if cache:
        labels = dict(next(iter(cache)))
        pc = _truth(labels.get("enable_prefix_caching"))
        if pc is not None:
            out["prefix_caching"] = pc
        b = labels.get("block_size")
        if b is not None and str(b).isdigit():
            out["block_size"] = int(b)
    if metrics is not None:
        # the spec-decode counters exist only on a speculative vLLM server, one per-position
        # series per draft position
        sp = promtext.spec_stats(metrics)
        if sp is not None and sp.get("k"):
            out["spec_k"] = int(sp["k"])
        elif sp is None and out.get("kind") == "vllm":
            out["spec_k"] = 0
    return out


def resolve(told: dict | None = None, flags: str | list | None = None, asked: dict | None = None) -> dict:
    """A measurement header's ``engine`` block: each field from the server's own answer
    (``asked``: :func:`queried`), else what the caller was told (``told``: explicit values such as
    ``--max-num-seqs``; then ``flags``: the server's command line, :func:`from_flags`), else
    absent. ``source`` names where each field came from; ``conflicts`` keeps a flag the server
    contradicted."""
    told = {k: v for k, v in (told or {}).items() if v is not None}
    stated = dict(from_flags(flags), **{k: v for k, v in told.items() if k in FIELDS})
    asked = asked or {}
    eng: dict[str, Any] = {}
    source: dict[str, str] = {}
    conflicts: dict[str, Any] = {}
    for f in FIELDS:
        if f in asked:
            eng[f], source[f] = asked[f], "server"
            if f in stated and stated[f] != asked[f] and not (f == "kind" and stated[f] == "vllm-cpu"):
                conflicts[f] = {"flags": stated[f], "server": asked[f]}
            if f == "kind" and stated.get(f) == "vllm-cpu":  # (a CPU build is still vLLM)
                eng[f], source[f] = "vllm-cpu", "flags"
        elif f in stated:
            eng[f], source[f] = stated[f], "flags"
    if not eng.get("spec_k"):
        eng.pop("spec_method", None)
        source.pop("spec_method", None)
    if asked.get("version"):
        eng["version"] = asked["version"]
    eng["source"] = source
    if conflicts:
        eng["conflicts"] = conflicts
    return eng


def spec_k(header: dict) -> int | None:
    """K of the server a measurement ran against (0: no speculation), None when unknown."""
    eng = header.get("engine") or {}
    if eng.get("spec_k") is not None:
        return int(eng["spec_k"])
    sp = header.get("spec") or {}
    return int(sp["k"]) if sp.get("k") is not None else None


def speculation_of(m: Measurement) -> tuple[int | None, str | None, str]:
    """(K, method, how it is known) of the server a measurement ran against: K = 0 when it did not
    speculate, None when the measurement cannot tell. vLLM's spec-decode counters first (they
    exist only on a speculative server, one per-position series per draft position), then the
    header's ``engine`` block (:func:`resolve`: the server's answer or its flags)."""
    sp = m.stats().get("spec")
    method = (m.header.get("engine") or {}).get("spec_method") or (m.header.get("spec") or {}).get("method")
    told = spec_k(m.header)
    if sp is not None:
        k = int(sp.get("k") or told or 0)
        drafts = float(sp.get("num_drafts") or 0)
        return k, method, f"vLLM's spec-decode counters ({drafts:.0f} drafts, {k} positions)"
    delta = m.stats().get("metrics_delta") or {}
    if any(str(name).startswith("vllm:") for name in delta):
        return 0, None, "no spec-decode counters in the server's /metrics"
    if told is not None:
        src = ((m.header.get("engine") or {}).get("source") or {}).get("spec_k", "header")
        return told, method, f"the measurement's header (from the {src})"
    return None, None, "not known (no spec-decode counters, no server flags)"


def describe(eng: dict) -> list[str]:
    """One line per setting a measurement's ``engine`` block records, with its source."""
    src = eng.get("source") or {}
    where = {"server": "the server's /v1/models and /metrics", "flags": "the server's flags"}
    lines = []
    for f in FIELDS:
        if f in eng:
            lines.append(f"{f} = {eng[f]} (from {where.get(src.get(f, ''), src.get(f) or 'the header')})")
    for f, c in (eng.get("conflicts") or {}).items():
        lines.append(f"{f}: the flags said {c['flags']}, the server says {c['server']} (the server's taken)")
    return lines
