"""Give every stored claim its key: a one-time migration of ``results.json`` files written
before claims had keys (run again, it changes nothing).

``python -m convergent.studies.migrate_keys docs/results`` rewrites, in each
``<study>-full`` folder, the claims of ``results.json`` and of every
``history/design<N>.results.json[.gz]``, adding ``key`` before ``statement``; nothing else in a
file changes, and a file whose claims all have keys is not rewritten.

Where each key comes from:

- the current results: the study's own code scores them again (`claims_from_results`) and each
  stored claim takes the key of the rescored claim with the same statement; a stored claim the
  code does not produce is an error, since then the results are not the code's.
- an earlier design's claims: the history tables used to match them to the current claims by
  their names (the statement up to its test, `legacy_names`); a matched claim takes its
  current counterpart's key, so every history row stays where it was. A claim with no
  counterpart takes its key from `RETIRED`, written here once, statement name to key.

After this migration, claims are matched by key only; the name matching lives on here alone,
to reproduce the tables that were matched by it.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from convergent.studies.framework import check_key

HISTORY_FILE = re.compile(r"design(?P<design>\d+)\.results\.json(\.gz)?$")
# A parenthesis inside a claim name's last one: " (0: 0.8, 0.25: 0.8)" in "(lr tuned per beta
# (0: 0.8, 0.25: 0.8), 2000 steps)".
NESTED = re.compile(r" \([^()]*\)(?=[^()]*\)$)")
# A qualifier at a name's end: " (ratio HORST / AdamW)".
QUALIFIER = re.compile(r" \([^()]*\)$")

# Earlier designs' claims with no counterpart among the current ones: (study, name) -> key.
RETIRED: dict[tuple[str, str], str] = {
    (
        "sparsity",
        "HORST's advantage survives a stronger pruner: after one-shot SparseGPT pruning to 70% a "
        "HORST-trained character LM still keeps a lower perplexity than an AdamW-trained one",
    ): "sparsity.horst_survives_sparsegpt_70",
    (
        "descent",
        "(a) Descent-constrained training gives per-layer losses that fall monotonically "
        "across layers, where ERM shows bumps",
    ): "descent.text_layers_monotone_where_erm_bumps",
    (
        "descent",
        "(a) Under gaussian token-embedding perturbations the constrained model degrades more "
        "gracefully than ERM",
    ): "descent.text_degrades_gracefully_gaussian",
    (
        "descent",
        "(a) Under uniform token-embedding perturbations the constrained model degrades more "
        "gracefully than ERM",
    ): "descent.text_degrades_gracefully_uniform",
    (
        "descent",
        "(a) Under discrete token-embedding perturbations the constrained model degrades more "
        "gracefully than ERM",
    ): "descent.text_degrades_gracefully_discrete",
    (
        "descent",
        "(a) Clean accuracy stays within a fraction of a point of ERM",
    ): "descent.text_clean_within_fraction_of_point",
    (
        "descent",
        "(b) Under out-of-distribution noise (>= 2x the training level) the constrained "
        "denoiser has lower test RMSE than ERM",
    ): "descent.video_lower_rmse_out_of_distribution",
    (
        "descent",
        "(b) The constrained denoiser's per-layer losses fall monotonically across layers",
    ): "descent.video_layers_fall_monotonically",
    (
        "langevin",
        "attention: with a light log or power regularizer, the generalization gap does not "
        "creep up",
    ): "langevin.attention_gap_flat_with_penalty",
    (
        "langevin",
        "attention: without a regularizer, the generalization gap creeps up",
    ): "langevin.attention_gap_creeps_without_penalty",
    (
        "langevin",
        "attention: prediction accuracy is about the same with or without a regularizer",
    ): "langevin.attention_same_accuracy",
    (
        "langevin",
        "lora: with a light log or power regularizer, the generalization gap does not creep up",
    ): "langevin.lora_gap_flat_with_penalty",
    (
        "langevin",
        "lora: without a regularizer, the generalization gap creeps up",
    ): "langevin.lora_gap_creeps_without_penalty",
    (
        "langevin",
        "lora: prediction accuracy is about the same with or without a regularizer",
    ): "langevin.lora_same_accuracy",
    (
        "residual",
        "Full-batch GD on a one-layer Transformer with residual connections converges linearly",
    ): "residual.converges_linearly",
    (
        "residual",
        "The rate is set by sigma_min^2 / sigma_max^2 of the attention output",
    ): "residual.rate_set_by_sigma_ratio",
    (
        "residual",
        "Convergence speeds up as beta goes from 0 to 1",
    ): "residual.speeds_up_with_beta",
    (
        "sparsity",
        "At 80-90 % sparsity HORST loses far less top-1 accuracy than AdamW",
    ): "sparsity.horst_loses_far_less_than_adamw_acdc_80_90",
    (
        "sparsity",
        "At 80-90 % sparsity HORST loses less top-1 accuracy than HAM",
    ): "sparsity.horst_loses_less_than_ham_acdc_80_90",
    (
        "sparsity",
        "One-shot pruning to 90% costs a HORST-trained language model less perplexity than an "
        "AdamW-trained one (ratio after/before)",
    ): "sparsity.horst_oneshot_costs_less_perplexity_90",
    (
        "sparsity",
        "HORST's weights concentrate near zero (fraction of prunable weights of magnitude < "
        "0.001, dense-trained language model)",
    ): "sparsity.horst_near_zero_lm_below_0p001",
    (
        "sparsity",
        "HORST's weights concentrate near zero: a larger share of the dense ViT's prunable "
        "weights lies below 0.01 x their tensor's RMS than AdamW's",
    ): "sparsity.horst_near_zero_vit_share_below_rms",
}


def _short_claim(statement: str) -> tuple[str, str]:
    """A statement split into the paper's words and its ``here: ...`` test."""
    for marker, closing in ((" (here: ", ""), ("; here: ", ")")):
        if marker in statement:
            head, _, here = statement.partition(marker)
            return head + closing, here.rstrip(").")
    return statement.rstrip("."), ""


def legacy_names(claims: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each claim's name as the history tables matched them before keys: its statement in the
    paper's words; claims of the same words are told apart by the first clause of their test
    that differs; a parenthesis nested in the name's last one is dropped."""
    heads = [_short_claim(claim["statement"]) for claim in claims]
    names = []
    for head, here in heads:
        others = [other.split(", ") for h, other in heads if h == head and other != here]
        if others:
            clauses = here.split(", ")
            differing = [
                c for i, c in enumerate(clauses) if any(i >= len(o) or o[i] != c for o in others)
            ]
            head = f"{head} ({differing[0] if differing else here})"
        names.append(NESTED.sub("", head))
    return names


def _counterparts(current: Sequence[str], earlier: Sequence[str]) -> dict[str, str]:
    """Each current name's earlier counterpart: the same name, else the one earlier name that
    is it with a qualifier appended, where no other current name could claim that earlier one."""
    found = {name: name for name in current if name in earlier}
    bases: dict[str, list[str]] = {}
    for name in earlier:
        if name not in found.values():
            bases.setdefault(QUALIFIER.sub("", name), []).append(name)
    for name in [name for name in current if name not in found]:
        candidates = bases.get(name, [])
        rivals = [other for other in current if other != name and QUALIFIER.sub("", other) == name]
        if len(candidates) == 1 and not rivals:
            found[name] = candidates[0]
    return found


def _read(path: Path) -> tuple[str, dict[str, Any]]:
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode()
    return text, json.loads(text)


def _write_if_changed(path: Path, before: str, payload: Mapping[str, Any]) -> bool:
    text = json.dumps(payload, indent=2) + "\n"
    if text == before:
        return False
    data = text.encode()
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return True


def _with_key(record: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``record`` with ``key`` first; an existing different key is an error (keys are stable)."""
    if record.get("key", key) != key:
        raise ValueError(f"claim {record['statement']!r} has key {record['key']!r}, not {key!r}")
    return {"key": check_key(key), **{k: v for k, v in record.items() if k != "key"}}


def current_keys(payload: Mapping[str, Any]) -> list[str]:
    """The keys of a current payload's claims, from the study's code rescoring it."""
    from convergent.studies import get_study

    rescored = get_study(payload["name"]).claims_from_results(payload)
    by_statement = {claim.statement: claim.key for claim in rescored}
    missing = [c["statement"] for c in payload["claims"] if c["statement"] not in by_statement]
    if missing:
        raise ValueError(f"the study's code does not produce the stored claims {missing}")
    return [by_statement[claim["statement"]] for claim in payload["claims"]]


def earlier_keys(
    study: str,
    claims: Sequence[Mapping[str, Any]],
    current: Sequence[Mapping[str, Any]],
    retired: Mapping[tuple[str, str], str] = RETIRED,
) -> list[str]:
    """The keys of an earlier design's ``claims``: the current counterpart's (``current``
    carries keys), else the ``retired`` key of its name (`RETIRED` by default)."""
    names = legacy_names(claims)
    current_names = legacy_names(current)
    found = _counterparts(current_names, names)
    key_of = {
        found[name]: claim["key"]
        for name, claim in zip(current_names, current, strict=True)
        if name in found
    }
    keys = []
    for name in names:
        key = key_of.get(name) or retired.get((study, name))
        if key is None:
            raise ValueError(f"no key for {study}'s earlier claim {name!r}: add it to RETIRED")
        keys.append(key)
    return keys


def migrate_folder(folder: str | Path) -> list[Path]:
    """Add keys to the claims of ``folder``'s results and history; returns the files rewritten."""
    folder = Path(folder)
    path = folder / "results.json"
    before, payload = _read(path)
    keys = current_keys(payload)
    payload["claims"] = [_with_key(c, k) for c, k in zip(payload["claims"], keys, strict=True)]
    changed = [path] if _write_if_changed(path, before, payload) else []
    for earlier in sorted(folder.glob("history/design*.results.json*")):
        if HISTORY_FILE.search(earlier.name) is None:
            continue
        text, old = _read(earlier)
        old_keys = earlier_keys(payload["name"], old["claims"], payload["claims"])
        old["claims"] = [_with_key(c, k) for c, k in zip(old["claims"], old_keys, strict=True)]
        if _write_if_changed(earlier, text, old):
            changed.append(earlier)
    return changed


def migrate(root: str | Path) -> list[Path]:
    """`migrate_folder` on every folder under ``root`` holding a ``results.json``."""
    return [
        p
        for found in sorted(Path(root).glob("*/results.json"))
        for p in migrate_folder(found.parent)
    ]


if __name__ == "__main__":
    for rewritten in migrate(sys.argv[1] if len(sys.argv) > 1 else "docs/results"):
        print(f"keys added: {rewritten}")
