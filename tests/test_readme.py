"""The README's results section is generated from the committed results.json files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from convergent.studies import EXPLORATORY_SENTENCE, get_study, study_advice, study_summary
from convergent.studies.framework import Sentence, misstated_verdicts, named_verdicts
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
REQUIRED = {
    "key", "statement", "verdict", "preview", "effect", "threshold", "interval", "n", "checks"
}  # fmt: skip


def test_readme_results_section_matches_the_committed_results(monkeypatch):
    monkeypatch.chdir(ROOT)
    current = update_readme(
        "README.md", "docs/results", check=True, summarize=study_summary, advise=study_advice
    )
    assert current, (
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


RESUMED_NOTES = [
    ("3 unit(s) reused from /u, 5 computed.", "took 12 s on 2 CPU cores to finish a resumed run"),
    ("8 unit(s) reused from /u, 0 computed.", "took 12 s on 2 CPU cores to assemble 8 units"),
    ("0 unit(s) reused from /u, 8 computed.", "took 12 s on 2 CPU cores; the report"),
    # Units that stored their compute time say what it was (summed over units).
    (
        "8 unit(s) reused from /u, 0 computed; the reused units' compute time: 36720 s (8 timed).",
        "to assemble 8 units computed earlier (their compute time (10.2 hours summed over "
        "units) is not in this figure)",
    ),
    (
        "3 unit(s) reused from /u, 5 computed; the reused units' compute time: 1500 s (2 timed).",
        "(3 of 8 units were computed earlier and their time (the 2 that stored it: 25 minutes "
        "summed over units) is not in this figure)",
    ),
    # Results assembled from a run and a part run alone (`reproduce --part`): one note each.
    (
        [
            "8 unit(s) reused from /u, 0 computed; the reused units' compute time: 3600 s "
            "(8 timed).",
            "Part (c) alone: 4 unit(s) reused from /u, 1 computed; the reused units' compute "
            "time: 3600 s (2 timed).",
        ],
        "to finish a resumed run (12 of 13 units were computed earlier and their time (the 10 "
        "that stored it: 2.0 hours summed over units) is not in this figure)",
    ),
]


@pytest.mark.parametrize(("note", "said"), RESUMED_NOTES)
def test_a_resumed_run_says_its_time_leaves_out_the_reused_units(tmp_path, note, said):
    payload = {
        "name": "toy",
        "mode": "full",
        "config": {"seeds": [0]},
        "claims": [],
        "seconds": 12.0,
        "notes": [note] if isinstance(note, str) else note,
    }
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "results.json").write_text(json.dumps(payload))
    assert said in results_section(tmp_path, relative_to=tmp_path)


def _claim(key, verdict="reproduced", checks=()):
    return {
        "key": key,
        "statement": f"the claim {key} (here: its test)",
        "verdict": verdict,
        "preview": False,
        "effect": 0.25,
        "unit": "u",
        "interval": [0.125, 0.5],
        "n": 5,
        "threshold": {"text": ">= 0"},
        "checks": list(checks),
    }


def test_the_compact_table_names_each_claim_by_key_and_what_left_it_untested():
    from convergent.studies.framework.common import compact_claim_rows

    failed = {"name": "|a - b| / c (mean over seeds)", "value": 0.5, "required": ">= 1",
              "passed": False}  # fmt: skip
    passed = {"name": "other check", "value": 2.0, "required": ">= 1", "passed": True}
    rows = compact_claim_rows(
        [_claim("toy.x_hot"), _claim("toy.x_warm", "untested", [passed, failed])]
    )
    assert rows[2:] == [
        "| `toy.x_hot` | reproduced | 0.25 [0.125, 0.5] | u | 5 |",
        r"| `toy.x_warm` | untested (\|a - b\| / c) | 0.25 [0.125, 0.5] | u | 5 |",
    ]


def test_every_row_of_the_readme_results_has_its_tables_cells():
    import re

    section = results_section(ROOT / "docs" / "results", relative_to=ROOT, advise=study_advice)
    advice, claims = section.split("### `", 1)
    for part, cells in ((advice, 6), (claims, 5)):
        rows = [line for line in part.splitlines() if line.startswith("| ")]
        assert rows
        for row in rows:
            assert len(re.split(r"(?<!\\)\|", row)) == cells + 2, row  # cells between bars


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.parent.name)
def test_each_summary_states_only_verdicts_the_results_hold(path):
    payload = json.loads(path.read_text())
    sentences = study_summary(payload)
    assert misstated_verdicts(sentences, payload) == []
    framework = {EXPLORATORY_SENTENCE}  # said by the framework, not the study's summary
    own = [sentence for sentence in sentences if sentence.text not in framework]
    superseded = len(own) == 1 and own[0].text.startswith("These are design ")
    if hasattr(get_study(payload["name"]), "brief") and not superseded:
        assert 2 <= len(own) <= 5
    exploratory = any(claim.get("exploratory") for claim in payload["claims"])
    assert (sentences[0].text == EXPLORATORY_SENTENCE) == exploratory


def test_a_misstated_or_undeclared_verdict_is_caught():
    payload = {"claims": [_claim("toy.x"), _claim("toy.y", "untested")]}
    assert named_verdicts("X is not reproduced, Y reproduced") == ["not reproduced", "reproduced"]
    right = Sentence("X held (reproduced).", {"toy.x": "reproduced"})
    assert misstated_verdicts([right], payload) == []
    wrong = Sentence("Y held (reproduced).", {"toy.y": "reproduced"})
    assert misstated_verdicts([wrong], payload) == [
        "'Y held (reproduced).' says 'toy.y' is reproduced, results: untested"
    ]
    unknown = Sentence("Z held (reproduced).", {"toy.z": "reproduced"})
    assert misstated_verdicts([unknown], payload) == [
        "'Z held (reproduced).' declares 'toy.z', which no claim has"
    ]
    undeclared = Sentence("Y is untested.", {})
    assert misstated_verdicts([undeclared], payload) == [
        "'Y is untested.' names ['untested'] without declaring it"
    ]


def test_no_markdown_table_is_cut_by_a_blank_line():
    # A blank line ends a table: a row after it, with no header and separator of its own, is
    # shown as a line of text (a design row appended with a blank line before it did this).
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        lines = path.read_text().splitlines()
        for number, (before, line, after) in enumerate(
            zip(["", *lines[:-1]], lines, [*lines[1:], ""], strict=True), start=1
        ):
            if line.startswith("|") and not before.strip() and not after.startswith("|--"):
                raise AssertionError(f"{path.relative_to(ROOT)}:{number}: a row outside a table")
