"""The Study protocol: every registered study satisfies it, and the framework's run owns the
sequence around a study's parts (design stamp, scoring from the stored form, report, finish)."""

from __future__ import annotations

import json

import pytest

from convergent.studies import STUDIES, get_study, study_config
from convergent.studies.framework import PilotedStudy, Study, json_ready, run_config
from tests.studies import toy_study


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_every_study_is_a_study_named_as_registered(name):
    study = get_study(name)
    assert isinstance(study, Study) and study.name == name
    # the pilots choose the designs of these two, and `reproduce --pilot` runs them
    assert isinstance(study, PilotedStudy) == (name in ("descent", "sparsity"))


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_final_seeds_never_share_a_seed_the_study_tunes_or_pilots_with(name):
    study = get_study(name)
    config = study.config("full")
    reserved = set(study.reserved_seeds(config))
    assert reserved, f"{name} names no seed it tunes with"
    assert not reserved & set(config.seeds)
    more = study_config(name, "full", seeds=len(config.seeds) + 12).seeds
    assert not reserved & set(more) and len(set(more)) == len(more)


def test_the_framework_stamps_the_design_and_scores_the_stored_form(tmp_path, monkeypatch):
    monkeypatch.setattr(toy_study, "COMPUTED", [])
    study = toy_study.STUDY
    monkeypatch.setattr(study, "design", 4, raising=False)
    scored = []

    def claims_from_results(results):
        scored.append(json.loads(json.dumps(results)))  # what a results.json would hold
        return toy_study.claims_from_results(results)

    monkeypatch.setattr(study, "claims_from_results", claims_from_results, raising=False)
    config = toy_study.Config(mode="quick", seeds=(0, 1))
    result = run_config(study, config, tmp_path, progress=False)
    assert list(result.data) == ["design", "units"] and result.data["design"] == 4
    assert scored == [{"config": json_ready(config), "data": json_ready(result.data)}]
    assert result.tables == {"numbers": [{"x": 1, "y": 2.5}]}
    assert result.notes[-1] == "0 unit(s) reused from " + str(tmp_path / "units") + ", 2 computed."
    again = run_config(study, config, tmp_path, progress=False)  # every unit from the cache
    assert toy_study.COMPUTED == [0, 1] and again.data == result.data
