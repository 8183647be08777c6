"""Claims carry stable keys: every committed result has them, and rescoring gives the same
claims under the same keys."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from convergent.studies import get_study
from convergent.studies.framework.claims import at_least, check_key, claim_from_seeds

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
STUDY_FOLDERS = sorted(path.parent for path in RESULTS.glob("*/results.json"))


def _read(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def _result_files(root: Path) -> list[Path]:
    return sorted(root.glob("*/results.json")) + sorted(
        root.glob("*/history/design*.results.json*")
    )


def test_a_claim_key_is_the_study_and_snake_case():
    assert (
        check_key("sparsity.horst_survives_sparsegpt_70") == "sparsity.horst_survives_sparsegpt_70"
    )
    for bad in (
        "horst_survives",
        "Sparsity.horst",
        "sparsity.Horst",
        "sparsity.horst-70",
        "sparsity.",
    ):
        with pytest.raises(ValueError, match="claim key"):
            check_key(bad)
    with pytest.raises(ValueError, match="claim key"):
        claim_from_seeds("a statement", [1.0], at_least(0.0), key="a statement", unit="u")


def test_every_committed_claim_has_a_unique_key():
    files = _result_files(RESULTS)
    assert len(files) >= 16
    for path in files:
        keys = [claim.get("key") for claim in _read(path)["claims"]]
        assert None not in keys, f"{path}: a claim without a key"
        assert len(set(keys)) == len(keys), f"{path}: repeated keys"
        study = _read(path)["name"]
        assert all(key.startswith(f"{study}.") for key in keys), path


@pytest.mark.parametrize("folder", STUDY_FOLDERS, ids=lambda folder: folder.name)
def test_rescoring_gives_the_stored_claims_under_their_keys(folder):
    stored = _read(folder / "results.json")
    rescored = [c.to_json() for c in get_study(stored["name"]).claims_from_results(stored)]
    fields = ("key", "verdict", "effect", "interval", "checks")
    assert [{f: c[f] for f in fields} for c in rescored] == [
        {f: c[f] for f in fields} for c in stored["claims"]
    ]


@pytest.mark.parametrize("folder", STUDY_FOLDERS, ids=lambda folder: folder.name)
def test_summaries_and_advice_refer_only_to_keys_the_claims_have(folder):
    from convergent.studies import study_advice, study_findings, study_summary

    payload = _read(folder / "results.json")
    keys = {claim["key"] for claim in payload["claims"]}
    for sentence in [*study_summary(payload), *study_findings(payload)]:
        assert set(sentence.verdicts) <= keys, sentence.text
    rows = study_advice(payload)
    assert rows
    for row in rows:
        assert row.evidence and set(row.evidence) <= keys, row.method


def test_a_summary_that_names_a_key_no_claim_has_fails():
    from convergent.studies.framework import claim_of, verdict_of

    payload = {"claims": [{"key": "toy.kept", "verdict": "reproduced"}]}
    assert verdict_of(payload, "toy.kept") == "reproduced"
    with pytest.raises(KeyError, match=r"toy\.renamed"):
        verdict_of(payload, "toy.renamed")
    with pytest.raises(KeyError, match=r"toy\.kept"):  # the error lists the keys there are
        claim_of(payload, "toy.renamed")
