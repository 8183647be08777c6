"""``convergent reproduce NAME --part P``: one part of a study run alone and added to the
study's written results (framework.parts), for a toy study and for sparsity's part (c)."""

from __future__ import annotations

import json

import pytest

from convergent.cli import main
from convergent.studies import get_study, run_study, run_study_part
from convergent.studies.framework import PartedStudy, PartRefused, json_ready
from convergent.studies.framework.readme import UNITS_NOTE
from tests.studies import toy_parted_study


@pytest.fixture
def toy(monkeypatch):
    from convergent import studies

    monkeypatch.setitem(studies.STUDIES, "toyparts", "tests.studies.toy_parted_study")
    monkeypatch.setitem(studies.STUDIES, "toy", "tests.studies.toy_study")
    monkeypatch.setattr(toy_parted_study, "COMPUTED", [])
    monkeypatch.setattr(toy_parted_study, "WITH_EXTRA", [True])
    return toy_parted_study


def _payload(folder):
    return json.loads((folder / "results.json").read_text())


def test_a_part_added_afterwards_gives_what_a_whole_run_gives(toy, tmp_path):
    whole = tmp_path / "whole"
    run_study("toyparts", "full", whole, progress=False)
    toy.WITH_EXTRA[0] = False  # the written run predates part "extra"
    run_study("toyparts", "full", tmp_path / "added", progress=False)
    before = _payload(tmp_path / "added" / "toyparts")
    assert [c["key"] for c in before["claims"]] == ["toy.one_plus_one_is_two"]
    toy.COMPUTED.clear()
    run_study_part("toyparts", "full", "extra", tmp_path / "added", progress=False)
    assert toy.COMPUTED == [0, 1, 2]
    expected, merged = _payload(whole / "toyparts"), _payload(tmp_path / "added" / "toyparts")
    # Every claim re-scored from the merged numbers: the earlier claim and the part's.
    assert merged["claims"] == expected["claims"] and len(merged["claims"]) == 2
    assert merged["data"] == expected["data"] and merged["tuning"] == expected["tuning"]
    assert merged["tables"] == expected["tables"]
    # The study's notes for the merged results, then each run's units note.
    units = str(tmp_path / "added" / "toyparts" / "units")
    assert merged["notes"] == [
        "3 sums and 3 extras.",
        f"0 unit(s) reused from {units}, 3 computed.",
        f"Part (extra) alone: 0 unit(s) reused from {units}, 3 computed.",
    ]
    assert merged["seconds"] > before["seconds"]
    report = (tmp_path / "added" / "toyparts" / "report.md").read_text()
    assert "the extra is at least 2.5" in report and "## extra" in report
    # Run again, the part's units come from the cache and nothing is measured twice; the
    # part's numbers replace those written before (here, spoilt by hand).
    merged["data"]["extra"][0]["extra"] = -1.0
    (tmp_path / "added" / "toyparts" / "results.json").write_text(json.dumps(merged))
    run_study_part("toyparts", "full", "extra", tmp_path / "added", progress=False)
    assert toy.COMPUTED == [0, 1, 2]
    again = _payload(tmp_path / "added" / "toyparts")
    assert again["data"] == expected["data"]
    # The part's units are counted once: its earlier note gives way to this run's.
    assert again["notes"][:2] == [
        "3 sums and 3 extras.",
        f"0 unit(s) reused from {units}, 3 computed.",
    ]
    assert len(again["notes"]) == 3
    assert again["notes"][2].startswith(f"Part (extra) alone: 3 unit(s) reused from {units}, 0 ")


def test_a_part_goes_onto_results_in_another_folder_with_its_units_in_out(toy, tmp_path):
    toy.WITH_EXTRA[0] = False
    run_study("toyparts", "full", tmp_path / "committed", progress=False)
    onto = tmp_path / "committed" / "toyparts"
    run_study_part("toyparts", "full", "extra", tmp_path / "work", onto=onto, progress=False)
    assert [c["key"] for c in _payload(onto)["claims"]] == ["toy.one_plus_one_is_two", "toy.extra"]
    assert len(list((tmp_path / "work" / "toyparts" / "units").glob("*.pt"))) == 3
    assert not (tmp_path / "work" / "toyparts" / "results.json").exists()


def test_a_part_is_refused_onto_results_it_does_not_belong_to(toy, tmp_path, monkeypatch):
    with pytest.raises(PartRefused, match=r"results\.json does not exist: a part is added to a"):
        run_study_part("toyparts", "full", "extra", tmp_path, progress=False)
    run_study("toyparts", "quick", tmp_path, progress=False)
    with pytest.raises(PartRefused, match="holds mode 'quick', but this run's mode is 'full'"):
        run_study_part("toyparts", "full", "extra", tmp_path, progress=False)
    with pytest.raises(PartRefused, match=r"another config \(seeds differ"):
        run_study_part("toyparts", "quick", "extra", tmp_path, progress=False, seeds=2)
    monkeypatch.setattr(toy.STUDY, "design", 2, raising=False)
    with pytest.raises(PartRefused, match="holds claims' design 1, but this run's claims' de"):
        run_study_part("toyparts", "quick", "extra", tmp_path, progress=False)
    with pytest.raises(PartRefused, match=r"no part 'nope' that runs alone; its parts that do: "):
        run_study_part("toyparts", "quick", "nope", tmp_path, progress=False)
    with pytest.raises(PartRefused, match=r"study toy has no part 'extra' .* do: none"):
        run_study_part("toy", "quick", "extra", tmp_path, progress=False)
    assert toy.COMPUTED == [0]  # from the one whole run: no refused part measured anything


def test_reproduce_part_on_the_command_line(toy, tmp_path, capsys):
    out = ["--out", str(tmp_path)]
    assert main(["reproduce", "toyparts", "--full", "--part", "extra", *out]) == 2
    assert "does not exist: a part is added to a written run" in capsys.readouterr().err
    toy.WITH_EXTRA[0] = False
    assert main(["reproduce", "toyparts", "--full", *out]) == 0
    capsys.readouterr()
    assert main(["reproduce", "toyparts", "--full", "--part", "extra", *out]) == 0
    printed = capsys.readouterr().out
    assert f"toyparts (full) part extra: running, adding it to {tmp_path / 'toyparts'}" in printed
    assert "] the extra is at least 2.5: effect" in printed
    for wrong, said in [
        (["toyparts", "toy", "--part", "extra"], "--part runs a part of one study, got toyparts"),
        (["toyparts", "--part", "extra", "--pilot"], "--pilot and --part are different runs"),
        (["toyparts", "--onto", str(tmp_path)], "--onto names where a part goes; give the part"),
        (["toyparts", "--full", "--part", "b"], "no part 'b' that runs alone; its parts that do"),
    ]:
        assert main(["reproduce", *wrong, *out]) == 2
        assert said in capsys.readouterr().err


def test_sparsity_runs_part_c_alone_and_its_notes_recompute_from_stored_results():
    from pathlib import Path

    from convergent.studies.sparsity.config import Config
    from convergent.studies.sparsity.report import study_notes

    study = get_study("sparsity")
    assert isinstance(study, PartedStudy) and list(study.parts) == ["c"]
    # A part's notes are the study's, recomputed from the merged results' stored form: from
    # the committed results.json they are the notes written by the whole run that made it.
    payload = _payload(Path(__file__).parents[2] / "docs" / "results" / "sparsity-full")
    config = Config.for_mode("full")
    assert json_ready(config) == payload["config"]
    notes = study_notes(config, payload["data"], payload["tuning"])
    assert notes == [note for note in payload["notes"] if not UNITS_NOTE.search(note)]
    assert len(notes) == len(payload["notes"]) - 2  # the whole run's units note and part (c)'s
