"""The README's results section is generated from the committed results.json files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from convergent.studies.framework.claims import PREVIEW_BELOW, VERDICTS
from convergent.studies.framework.readme import (
    END,
    START,
    replace_section,
    results_section,
    update_readme,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "docs" / "results").glob("*/results.json"))
REQUIRED = {"statement", "verdict", "preview", "effect", "threshold", "interval", "n", "checks"}


def test_readme_results_section_matches_the_committed_results(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert update_readme("README.md", "docs/results", check=True), (
        "README.md's results section differs from docs/results/*/results.json; regenerate it "
        "with: convergent report docs/results --readme README.md"
    )


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.parent.name)
def test_committed_results_follow_the_claims_schema(path):
    payload = json.loads(path.read_text())
    assert payload["claims"], f"{path} has no claims"
    for claim in payload["claims"]:
        assert set(claim) >= REQUIRED, f"{path}: {sorted(REQUIRED - set(claim))} missing"
        assert claim["verdict"] in VERDICTS
        assert claim["preview"] is (claim["n"] < PREVIEW_BELOW)
        assert claim["checks"], f"{path}: '{claim['statement']}' has no manipulation check"
        for check in claim["checks"]:
            assert {"name", "value", "required", "passed"} <= set(check)
        if any(check["passed"] is not True for check in claim["checks"]):
            assert claim["verdict"] == "untested"
        if claim["interval"] is not None:
            low, high = claim["interval"]
            assert low <= claim["effect"] <= high


def test_section_replacement_keeps_the_rest_of_the_readme():
    text = f"intro\n{START}\nold\n{END}\noutro\n"
    assert replace_section(text, "new\n") == f"intro\n{START}\nnew\n{END}\noutro\n"
    with pytest.raises(ValueError, match="no generated results section"):
        replace_section("no markers", "new\n")


def test_the_readme_points_at_nothing_outside_the_repository():
    text = (ROOT / "README.md").read_text()
    assert "shared/" not in text and "../" not in text
    assert results_section(ROOT / "docs" / "results", relative_to=ROOT).count("### `") == len(
        RESULTS
    )


def test_a_resumed_run_says_its_time_leaves_out_the_reused_units(tmp_path):
    payload = {
        "name": "toy",
        "mode": "full",
        "config": {"seeds": [0]},
        "claims": [],
        "seconds": 12.0,
        "notes": ["3 unit(s) reused from /somewhere/units, 5 computed."],
    }
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "results.json").write_text(json.dumps(payload))
    text = results_section(tmp_path, relative_to=tmp_path)
    assert "took 12 s on 2 CPU cores to finish a resumed run (3 of 8 units" in text
    payload["notes"] = ["8 unit(s) reused from /somewhere/units, 0 computed."]
    (tmp_path / "toy" / "results.json").write_text(json.dumps(payload))
    assert "took 12 s on 2 CPU cores to assemble 8 units computed earlier" in results_section(
        tmp_path, tmp_path
    )
    payload["notes"] = ["0 unit(s) reused from /somewhere/units, 8 computed."]
    (tmp_path / "toy" / "results.json").write_text(json.dumps(payload))
    assert "took 12 s on 2 CPU cores; the report" in results_section(tmp_path, tmp_path)
