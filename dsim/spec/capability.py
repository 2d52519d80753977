"""Which speculative methods a model can run, and whose acceptance a method is sized on.

A method that drafts with the model's own head needs the model to have one: MTP-k the model's
multi-token-prediction layers (the config's ``num_nextn_predict_layers`` > 0, as in DeepSeek-V3
and V4), DSpark a DSpark drafter trained for the model (``SpecMethod.model_head`` names what a
method needs). What a model has is read from the model, never from its name:

1. the profile's ``provenance.heads`` (a list, e.g. ``[mtp]``), where a profile states it;
2. else the model's config under ``profiles/models/<provenance.model>.json``: ``mtp`` when
   ``num_nextn_predict_layers`` > 0, plus every key of dsim's ``_drafters`` note (a published
   drafter for that model, with its source);
3. else unknown (said, not guessed).

EAGLE-3 and block drafters are separate draft models that can be trained for any target; dsim
does not check that one exists. A method the model cannot run is still simulated, as a
hypothetical on the acceptance it assumes: plan, sweep and ab mark it where they show it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# what a method needs, and where a model config says it has none
HEAD_WORDS = {"mtp": "MTP head", "dspark": "DSpark drafter"}
CONFIG_EVIDENCE = {"mtp": "num_nextn_predict_layers 0 or absent", "dspark": "no dspark entry in _drafters"}


@dataclass(frozen=True)
class MethodFit:
    """Whether a model can run a method: ``runnable`` True (it has what the method needs, or the
    method needs nothing of the model), False (it has not: the method is hypothetical) or None
    (unknown); ``reason`` says why, naming the source."""

    runnable: bool | None
    reason: str

    @property
    def hypothetical(self) -> bool:
        return self.runnable is False


def _model_config(model: str | None) -> tuple[dict | None, str]:
    from dsim.cost import PROFILE_DIR

    if not model:
        return None, "the profile names no model (provenance.model)"
    p = Path(PROFILE_DIR) / "models" / f"{model}.json"
    if not p.is_file():
        return None, f"no config for model {model} under profiles/models"
    try:
        return json.loads(p.read_text()), f"profiles/models/{p.name}"
    except (OSError, json.JSONDecodeError):
        return None, f"profiles/models/{p.name} unreadable"


def model_heads(profile: Any) -> tuple[frozenset | None, str, str | None]:
    """(the heads a profile's model has, where that is read from, the kind of source: ``profile``
    (its provenance.heads), ``config`` (the model's config) or None (unknown: heads None))."""
    prov = profile.provenance or {}
    heads = prov.get("heads")
    if isinstance(heads, (list, tuple)):
        return frozenset(str(h).lower() for h in heads), f"profile {profile.name}: provenance.heads", "profile"
    cfg, where = _model_config(prov.get("model"))
    if cfg is None:
        return None, where, None
    return heads_from_config(cfg), where, "config"


def heads_from_config(cfg: dict) -> frozenset:
    """The heads a Hugging Face style config.json says a model has: ``mtp`` where
    ``num_nextn_predict_layers`` > 0, and the keys of dsim's ``_drafters`` note. A profile built
    from a config (analytical, composed) can record them as ``provenance.heads``."""
    out = set()
    if int(cfg.get("num_nextn_predict_layers") or 0) > 0:
        out.add("mtp")
    drafters = cfg.get("_drafters")
    if isinstance(drafters, dict):
        out |= {str(k).lower() for k in drafters}
    return frozenset(out)


def method_fit(method: str, profile: Any) -> MethodFit:
    """Can the profile's model run ``method`` (a SpecMethod name)?"""
    from dsim.spec.methods import make_method

    need = make_method(method).model_head
    if need is None:
        return MethodFit(True, "")
    heads, where, kind = model_heads(profile)
    model = (profile.provenance or {}).get("model") or profile.name
    if heads is None:
        return MethodFit(None, f"whether {model} has a {HEAD_WORDS[need]} is unknown ({where})")
    if need in heads:
        return MethodFit(True, f"{model} has a {HEAD_WORDS[need]} ({where})")
    evidence = CONFIG_EVIDENCE[need] if kind == "config" else f"no {need} listed"
    return MethodFit(False, f"{model} has no {HEAD_WORDS[need]} ({where}: {evidence})")


@dataclass(frozen=True)
class AcceptanceOrigin:
    """Whose acceptance a method is sized on: ``label`` for a table cell, ``users`` True when the
    user gave it (inline curves, a file such as a calibration), ``other_model`` True when it is a
    preset of another model than the profile's (the profile's provenance.model not among the
    preset's ``models``), None where that is not known (the user's curves, a profile naming no
    model)."""

    label: str
    users: bool
    other_model: bool | None


def acceptance_origin(acceptance: str | None, method: str, profile: Any) -> AcceptanceOrigin | None:
    """The origin of the acceptance a method uses (None without drafts)."""
    from dsim.spec.acceptance import load_acceptance, preset_names
    from dsim.spec.methods import acceptance_name, make_method

    m = make_method(method)
    if not m.drafts:
        return None
    name = acceptance_name(acceptance, m.name)
    if name not in preset_names():
        shown = Path(name).name if Path(name).suffix.lower() in (".yaml", ".yml", ".json") else name
        return AcceptanceOrigin(f"given: {shown}", True, None)
    curves = load_acceptance(name, m.name)
    model = str((profile.provenance or {}).get("model") or "")
    if not model:
        return AcceptanceOrigin(f"{name} preset (profile names no model)", False, None)
    own = model in curves.models
    return AcceptanceOrigin(f"{name} preset" + ("" if own else f" (not {model}'s)"), False, not own)
