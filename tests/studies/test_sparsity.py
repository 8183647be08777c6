"""The sparsity study: smoke run end to end, resume, design 4's claims scored from a hand-made
payload (and refused for an earlier design's, the committed full results included), a sweep
that never reads the test split, and `convergent prune` on a run folder."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from scipy import stats

from convergent.commands import format_prune_summary, prune_run
from convergent.data import is_cached
from convergent.sparse import Masks
from convergent.studies import VERDICTS
from convergent.studies.framework import json_ready, run_config, run_part, write_study
from convergent.studies.framework.history import HISTORY_FILE
from convergent.studies.sparsity import (
    STUDY,
    Config,
    claims_from_results,
    finetune_runs,
    pruned_score_of_good_dense,
)
from convergent.studies.sparsity import runs as sparsity_runs
from convergent.train import load_checkpoint
from tests.conftest import RefusingTestSplit, assert_drawn_figure
from tests.studies.sparsity_payload import design4_payload

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "results" / "sparsity-full"
# The full results of earlier designs, with the claims they were scored with (data only).
HISTORY = COMMITTED / "history"


def _needs(name: str) -> None:
    if shutil.which("apt-get") is None and not is_cached(name):
        pytest.skip(f"{name} needs apt-get (a Debian or Ubuntu machine) or a cached copy")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """One smoke run, written to a folder that the resume test runs into again."""
    _needs("fashion-mnist")
    _needs("austen")
    folder = tmp_path_factory.mktemp("sparsity-smoke")
    config = Config.for_mode("smoke")
    result = run_config(STUDY, config, folder, progress=False)
    write_study(result, folder)
    return config, folder, result


def _unit_files(folder: Path) -> list[str]:
    return sorted(path.name for path in (folder / "units").glob("*.pt"))


def test_smoke_study_runs_end_to_end(smoke_run):
    _, folder, result = smoke_run
    assert (folder / "report.md").is_file()
    for figure in result.figures:
        assert_drawn_figure(folder / figure)
    payload = json.loads((folder / "results.json").read_text())
    data = payload["data"]
    assert data["design"] == 4 and data["rms_fraction"] == 0.01
    vision, language = data["vision"], data["language"]
    assert set(vision["accuracy"]) == {"adamw", "ham", "horst"}
    for by_key in vision["accuracy"].values():
        assert set(by_key) == {"dense", "90%"}
        assert all(
            0.0 <= v <= 1.0 and len(values) == 1 for values in by_key.values() for v in values
        )
    for by_key in vision["achieved"].values():
        assert by_key["90%"][0] == pytest.approx(0.9, abs=1e-3)  # exact top-k
    # Each grid has the same number of points; the selection holds every point's score.
    assert {name: len(points) for name, points in vision["selection"].items()} == {
        "adamw": 1,
        "ham": 1,
        "horst": 1,
    }
    assert vision["selected"]["horst"] == {"lr": 2e-3, "alpha": 50.0}
    # Every LM is scored by every pruner at every target; the dense score is shared.
    for by_pruner in language["perplexity"].values():
        assert set(by_pruner) == {"magnitude", "wanda", "sparsegpt"}
        assert all(set(by_key) == {"0%", "70%", "90%"} for by_key in by_pruner.values())
        assert len({by_key["0%"][0] for by_key in by_pruner.values()}) == 1
    selection_ppl = language["selection"]["horst"][0]["validation_perplexity"]
    assert set(selection_ppl) == {"magnitude", "wanda", "sparsegpt"}
    # The manipulation checks' quantities are stored per run: HORST's and HAM's move ratios,
    # HORST's first-order strength (alpha x mean |theta| at initialization).
    for name in ("horst", "ham"):
        assert vision["move_ratio"][name]["90%"][0] > 0.0
        assert vision["selection"][name][0]["move_ratio"] > 0.0
    assert vision["selection"]["adamw"][0]["move_ratio"] is None
    assert vision["selection"]["ham"][0]["strength"] is None
    assert vision["strength"]["horst"][0] > 0.0 and language["strength"]["horst"][0] > 0.0
    assert language["move_ratio"]["horst"][0] > 0.0
    assert all(0.0 <= v[0] <= 1.0 for v in vision["near_zero_share"].values())
    assert all(0.0 <= v[0] <= 1.0 for v in language["near_zero_share"].values())
    # Smoke has one final seed: every claim is a preview with a finite effect and its checks.
    # 4 ViT claims; the LM's near-zero claim and 3 pruners x (70 %, 90 %); part (c)'s dense
    # claim and one per smoke variant (3).
    assert len(payload["claims"]) == 15
    for claim in payload["claims"]:
        assert claim["verdict"] in VERDICTS
        assert claim["preview"] is True and claim["n"] == 1 and claim["interval"] is None
        assert math.isfinite(claim["effect"]) and claim["per_seed"] == [claim["effect"]]
        assert "mirror move / Adam move" in claim["checks"][0]["name"]
    rescored = claims_from_results({"config": payload["config"], "data": data})
    assert [c.to_json() for c in rescored] == payload["claims"]
    titles = [
        "(a) ViT, AC/DC at the selection sparsity, selection seed",
        "(b) LM, one-shot at the largest target, selection seed",
        "(c) MiniLM fine-tune, SparseGPT 70 % on validation, selection seed",
    ]
    assert sorted(payload["tuning"]) == sorted(titles)
    # Part (c): every final run marks each test sentence, dense and per variant.
    finetune = data["finetune"]
    assert finetune["variants"] == ["magnitude 70%", "sparsegpt 70%", "wanda owl 70%"]
    for runs in finetune["runs"].values():
        (unit,) = runs
        assert set(unit["correct"]) == {"dense", *finetune["variants"]}
        assert {len(marks) for marks in unit["correct"].values()} == {finetune["sentences"]}
        assert all(abs(unit["achieved"][v] - 0.7) < 0.01 for v in finetune["variants"])
    assert finetune["runs"]["horst"][0]["move_ratio"] > 0.0
    assert finetune["runs"]["adamw"][0]["move_ratio"] is None
    assert 0.0 <= finetune["readout"]["validation_accuracy"] <= 1.0
    # 3 selection + 6 final classifier units, 2 + 2 language-model units; part (c): 2
    # selection, 1 readout-only and 2 final fine-tunes.
    assert len(_unit_files(folder)) == 18
    assert payload["notes"][-1].endswith(" 18 computed.")  # part (c)'s own cache counted in


def test_resume_computes_nothing_twice_and_a_changed_config_recomputes(smoke_run, monkeypatch):
    config, folder, first = smoke_run
    before = _unit_files(folder)

    class Trained(Exception):
        pass

    def refuse(*args, **kwargs):
        raise Trained

    monkeypatch.setattr(sparsity_runs, "train_classifier", refuse)
    monkeypatch.setattr(sparsity_runs, "train_language_model", refuse)
    monkeypatch.setattr(finetune_runs, "fit_recipe", refuse)
    again = run_config(
        STUDY, config, folder, progress=False
    )  # every unit from the cache: nothing trains
    assert [c.to_json() for c in again.claims] == [c.to_json() for c in first.claims]
    assert json.dumps(json_ready(again.data)) == json.dumps(json_ready(first.data))
    assert again.tuning == first.tuning
    assert _unit_files(folder) == before
    # A field that only chooses how fast units run reuses them; one that changes what a
    # unit computes does not.
    run_config(STUDY, dataclasses.replace(config, threads=2), folder, progress=False)
    with pytest.raises(Trained):
        run_config(
            STUDY,
            dataclasses.replace(config, vit_steps=config.vit_steps + 1),
            folder,
            progress=False,
        )


def test_part_c_run_alone_onto_the_written_run_gives_the_whole_runs_results(
    smoke_run, monkeypatch, tmp_path
):
    config, folder, _ = smoke_run
    onto = tmp_path / "written"
    shutil.copytree(folder, onto, ignore=shutil.ignore_patterns("units"))
    written = json.loads((onto / "results.json").read_text())
    (onto / "finetune_pruning.png").unlink()

    def refuse(*args, **kwargs):
        raise AssertionError("a finished fine-tune was trained again")

    monkeypatch.setattr(finetune_runs, "fit_recipe", refuse)
    merged = run_part(STUDY, config, "c", folder, onto, progress=False)
    write_study(merged, onto)
    again = json.loads((onto / "results.json").read_text())
    for key in ("claims", "data", "tuning", "tables", "figures"):
        assert json.dumps(again[key], sort_keys=True) == json.dumps(written[key], sort_keys=True)
    assert again["notes"][:-1] == written["notes"]  # the study's notes and the run's units note
    assert again["notes"][-1].startswith("Part (c) alone: 5 unit(s) reused from ")
    assert_drawn_figure(onto / "finetune_pruning.png")


def test_selection_runs_never_touch_the_test_split(monkeypatch):
    _needs("fashion-mnist")
    _needs("austen")
    config = Config.for_mode("smoke")
    splits, train, validation, _ = sparsity_runs.vision_data(
        config.image_size,
        config.patch,
        config.train_examples,
        config.validation_examples,
        config.test_examples,
    )
    monkeypatch.setattr(
        sparsity_runs, "vision_data", lambda *a: (splits, train, validation, RefusingTestSplit())
    )
    point = {"lr": 2e-3, "alpha": 50.0}
    unit = sparsity_runs.vision_unit(config, "horst", point, 0, 0.9, False)
    assert "test_accuracy" not in unit and 0.0 <= unit["validation_accuracy"] <= 1.0
    with pytest.raises(AssertionError, match="read the test split"):
        sparsity_runs.vision_unit(config, "horst", point, 1, 0.9, True)
    lm_splits, lm_validation, _ = sparsity_runs.language_data(
        config.lm_seq_len, config.lm_validation_windows, config.lm_test_windows
    )
    monkeypatch.setattr(
        sparsity_runs, "language_data", lambda *a: (lm_splits, lm_validation, RefusingTestSplit())
    )
    lm_unit = sparsity_runs.language_unit(config, "horst", point, 0, False)
    assert lm_unit["split"] == "validation"


def test_design_four_claims_follow_their_formulas():
    claims = claims_from_results(design4_payload())
    assert [claim.key for claim in claims] == [
        "sparsity.horst_beats_adamw_acdc_90",
        "sparsity.horst_beats_ham_acdc_90",
        "sparsity.horst_loses_half_of_adamw_acdc_80_90",
        "sparsity.horst_near_zero_vit",
        "sparsity.horst_near_zero_char_lm",
        *(
            f"sparsity.horst_lower_perplexity_{pruner}_{target}"
            for pruner in ("magnitude", "wanda", "sparsegpt")
            for target in (70, 90)
        ),
    ]
    assert claims[0].statement.startswith(
        "At 90% sparsity HORST reaches a higher top-1 accuracy than AdamW (here:"
    )
    than_adamw, than_ham, half, vit_zero, lm_zero, *one_shot = claims
    assert than_adamw.per_seed == pytest.approx([0.02, 0.025, 0.03])
    assert than_adamw.interval == pytest.approx(_t_interval([0.02, 0.025, 0.03]))
    assert than_adamw.verdict == "reproduced"  # interval (0.0126, 0.0374) is above 0
    assert [check.value for check in than_adamw.checks] == pytest.approx([0.3, 0.0, 0.08])
    assert than_ham.per_seed == pytest.approx([0.80 - 0.76, 0.805 - 0.77, 0.81 - 0.75])
    # HORST's move, HAM's move, AC/DC's targets, HAM's room: 0.85 - mean(0.76, 0.77, 0.75)
    assert [check.value for check in than_ham.checks] == pytest.approx([0.3, 0.5, 0.0, 0.09])
    assert than_ham.checks[1].name.startswith("HAM mirror move / Adam move")
    assert than_ham.checks[3].name.startswith("HAM loses at least 3 points from dense to 90%")
    assert than_ham.verdict == "reproduced"
    # Claim 3: drop_h - 0.5 drop_a, drops averaged over 80 % and 90 %.
    drops_h = [0.85 - (0.83 + 0.80) / 2, 0.85 - (0.82 + 0.805) / 2, 0.85 - (0.84 + 0.81) / 2]
    drops_a = [0.86 - (0.80 + 0.78) / 2, 0.86 - (0.81 + 0.78) / 2, 0.86 - (0.79 + 0.78) / 2]
    assert half.per_seed == pytest.approx(
        [h - 0.5 * a for h, a in zip(drops_h, drops_a, strict=True)]
    )
    assert vit_zero.per_seed == pytest.approx([0.012, 0.021, 0.015])
    assert vit_zero.verdict == "reproduced" and vit_zero.checks[0].value == pytest.approx(0.5)
    assert lm_zero.per_seed == pytest.approx([0.012, 0.016, 0.02])
    # HORST's move; the floor: the selected dense perplexities over the best (AdamW's 4.0), the
    # larger of AdamW's 4.0 / 4.0 and HORST's 4.2 / 4.0.
    assert [check.value for check in lm_zero.checks] == pytest.approx([0.6, 1.05])
    # The one-shot claims: ppl_horst / ppl_adamw per seed (the ratios of sparsity_payload).
    ratios = [
        [6.0 / 8, 6.4 / 8, 5.6 / 8],
        [9.0 / 10, 9.0 / 12, 9.0 / 8],
        [6.6 / 6, 6.48 / 6, 6.72 / 6],
        [16 / 20, 18 / 20, 14 / 20],
        [4.5 / 5, 4.6 / 5, 4.4 / 5],
        [9.5 / 10, 10.5 / 10, 10.0 / 10],
    ]
    verdicts = [
        "reproduced",  # (0.63, 0.87) below 1
        "inconclusive",
        "not reproduced",  # (1.05, 1.15) above 1
        "inconclusive",
        "reproduced",  # (0.85, 0.95)
        "inconclusive",
    ]
    for claim, expected, verdict in zip(one_shot, ratios, verdicts, strict=True):
        assert claim.per_seed == pytest.approx(expected)
        assert claim.interval == pytest.approx(_t_interval(expected))
        assert claim.verdict == verdict and claim.threshold.text == "<= 1"
        assert [check.value for check in claim.checks] == pytest.approx([0.6, 1.05])
    # SparseGPT at 70 % also says what design 3 scored again as a claim of its own (rule 14).
    sparsegpt_70 = one_shot[4]
    assert sparsegpt_70.extra == {"pruner": "sparsegpt", "sparsity": "70%"}
    assert "calibrated on 128 training windows" in sparsegpt_70.statement
    assert "survives a pruner that updates the kept weights" in sparsegpt_70.statement
    assert not any("survives" in claim.statement for claim in one_shot if claim is not sparsegpt_70)


def test_a_selected_lm_outside_the_dense_floor_leaves_every_lm_claim_untested():
    # AdamW's selected point at 4.7 > 1.1 x 4.2 (the best dense is now HORST's 4.2): a
    # selection that fell back to a point nothing chose.
    claims = claims_from_results(design4_payload(adamw_selected_dense=4.7))
    lm = [c for c in claims if "character LM" in c.statement]
    assert len(lm) == 7
    for claim in lm:
        floor = claim.checks[1]
        assert floor.value == pytest.approx(4.7 / 4.2) and floor.passed is False
        assert claim.verdict == "untested"
    assert all(c.verdict != "untested" for c in claims[:2])  # the ViT claims do not read it
    # Just inside the floor (4.6 = 1.095 x 4.2) it passes.
    inside = claims_from_results(design4_payload(adamw_selected_dense=4.6))
    assert inside[4].checks[1].passed and inside[4].verdict != "untested"
    # Without stored selection grids the floor is not measured: untested, not failed.
    payload = design4_payload()
    del payload["data"]["language"]["selection"]
    unmeasured = claims_from_results(payload)[4]
    assert unmeasured.checks[1].value is None and unmeasured.verdict == "untested"


def test_a_baseline_without_room_to_fail_leaves_the_claim_untested():
    claims = claims_from_results(design4_payload(adamw_dense=0.80, adamw_90=0.78))
    room = claims[0].checks[2]
    assert room.value == pytest.approx(0.02) and room.passed is False
    assert claims[0].verdict == "untested" and claims[2].verdict == "untested"
    assert claims[1].verdict != "untested"  # the HAM comparison reads HAM's room, not AdamW's


@pytest.mark.parametrize(
    ("changes", "failed", "value"),
    [
        ({"ham_move": 0.1}, 1, 0.1),  # HAM's mirror step barely acts
        ({"ham_move": 0.19}, 1, 0.19),
        ({"ham_dense": 0.78}, 3, 0.78 - 0.76),  # HAM loses 2 points from dense to 90 %
    ],
)
def test_the_ham_comparison_is_untested_when_ham_barely_acts_or_has_no_room(changes, failed, value):
    claims = claims_from_results(design4_payload(**changes))
    than_ham = claims[1]
    assert than_ham.checks[failed].value == pytest.approx(value)
    assert than_ham.checks[failed].passed is False
    assert [check.passed for i, check in enumerate(than_ham.checks) if i != failed] == [True] * 3
    assert than_ham.verdict == "untested"
    assert claims[0].verdict == "reproduced"  # the AdamW comparison does not read HAM
    # At the floor itself the check passes.
    at_floor = claims_from_results(design4_payload(ham_move=0.2))[1]
    assert at_floor.checks[1].passed and at_floor.verdict == "reproduced"


@pytest.mark.parametrize(
    ("pruners", "sparsities", "one_shot"),
    [
        (["magnitude", "wanda", "sparsegpt"], [0.5, 0.7, 0.9], 6),
        (["magnitude", "sparsegpt"], [0.7, 0.9], 4),
        (["magnitude", "wanda"], [0.5, 0.7, 0.9], 4),
        (["magnitude", "wanda", "sparsegpt"], [0.5, 0.9], 3),
        (["magnitude"], [0.9], 1),
    ],
)
def test_one_claim_per_pruner_and_target_and_none_counted_twice(pruners, sparsities, one_shot):
    payload = design4_payload()
    payload["config"] = {**payload["config"], "lm_pruners": pruners, "lm_sparsities": sparsities}
    claims = claims_from_results(payload)
    assert len([c for c in claims if c.statement.startswith("One-shot ")]) == one_shot
    # One result, one claim: no two claims share their per-seed values, nor a key.
    assert len({tuple(c.per_seed) for c in claims}) == len(claims)
    assert len({c.key for c in claims}) == len(claims)
    # 50 % is run but never claimed: the claims read 70 % and 90 % only.
    assert not any("pruning to 50%" in c.statement for c in claims)


def _committed() -> dict:
    return json.loads((COMMITTED / "results.json").read_text())


def _t_interval(values: list[float]) -> tuple[float, float]:
    count = len(values)
    mean = sum(values) / count
    deviation = math.sqrt(sum((v - mean) ** 2 for v in values) / (count - 1))
    half = stats.t.ppf(0.975, count - 1) * deviation / math.sqrt(count)
    return mean - half, mean + half


def test_an_earlier_design_is_refused_with_one_sentence_naming_both_designs():
    first = json.loads((HISTORY / "design1.results.json").read_text())
    assert "design" not in first["data"]
    message = (
        r"^these sparsity results are of design 1 \(no design number\), and this code scores "
        r"design 4 only; earlier designs' full results, with the claims they were scored with, "
        r"are in docs/results/sparsity-full/history/$"
    )
    with pytest.raises(ValueError, match=message):
        claims_from_results(first)
    later = design4_payload()
    later["data"]["design"] = 5
    with pytest.raises(ValueError, match="of design 5, and this code scores design 4 only"):
        claims_from_results(later)


def test_history_files_hold_the_claims_they_were_scored_with():
    files = sorted(
        path
        for path in HISTORY.glob("design*.results.json")
        if HISTORY_FILE.search(path.name)["tag"] is None  # type: ignore[index]
    )
    # design 4 as scored before the statistics changed, kept beside its re-scoring
    assert (HISTORY / "design4.before-kept-variance.results.json").is_file()
    assert [path.name for path in files] == [
        "design1.results.json",
        "design2.results.json",
        "design3.results.json",
    ]
    for path in files:
        payload = json.loads(path.read_text())
        assert payload["name"] == "sparsity" and payload["mode"] == "full"
        assert payload["claims"]
        assert all(claim["verdict"] in VERDICTS for claim in payload["claims"])


def test_the_committed_full_results_are_design_four_and_rescore_to_their_verdicts():
    # Design 2's run (its LM pruned by magnitude alone, HAM's move ratio not recorded) lives in
    # history/ and this code refuses to score it; design 4's rescores to what it stored.
    payload = _committed()
    assert payload["data"]["design"] == 4 and len(payload["config"]["seeds"]) >= 5
    rescored = claims_from_results(payload)
    assert [(c.verdict, c.effect) for c in rescored] == [
        (c["verdict"], c["effect"]) for c in payload["claims"]
    ]
    earlier = json.loads((HISTORY / "design2.results.json").read_text())
    with pytest.raises(ValueError, match=r"of design 2, and this code scores design 4 only"):
        claims_from_results(earlier)
    # Design 3 is the same runs with the survival claim counted apart: its history file keeps
    # that verdict, and design 4's claims are its claims less that one, number for number.
    # Part (c), new in design 4, was added to those runs' results alone (reproduce --part c).
    third = json.loads((HISTORY / "design3.results.json").read_text())
    assert third["data"] | {"design": 4} == {
        key: value for key, value in payload["data"].items() if key != "finetune"
    }
    kept = [c for c in third["claims"] if c["key"] != "sparsity.horst_survives_sparsegpt_70"]
    assert len(kept) == len(third["claims"]) - 1
    assert [(c["key"], c["verdict"], c["effect"], c["interval"]) for c in kept] == [
        (c["key"], c["verdict"], c["effect"], c["interval"])
        for c in payload["claims"]
        if not c["key"].startswith("sparsity.finetune_")
    ]
    assert len(payload["claims"]) == len(kept) + 1 + len(payload["data"]["finetune"]["variants"])


def test_language_selection_skips_points_whose_dense_model_is_over_ten_percent_worse():
    magnitude = [
        {"0%": 5.0, "90%": 16.0},  # the best dense model
        {"0%": 5.5, "90%": 14.0},  # exactly 1.1 x: still selectable
        {"0%": 5.51, "90%": 9.0},  # just over: excluded
        {"0%": 11.6, "90%": 11.7},  # a degenerate model that prunes well
        {"0%": math.nan, "90%": math.nan},  # diverged
    ]
    # The selection reads magnitude pruning only: SparseGPT's scores (here the reverse order)
    # never move it.
    units = [
        {"perplexity": {"magnitude": scores, "sparsegpt": {"0%": scores["0%"], "90%": -i}}}
        for i, scores in enumerate(magnitude)
    ]
    score = pruned_score_of_good_dense(units, "90%")
    scores = [score(unit) for unit in units]
    assert scores[:2] == [16.0, 14.0]
    assert all(math.isnan(value) for value in scores[2:])


def test_a_run_whose_gradient_turns_nan_is_a_diverged_grid_point_not_a_crash():
    from convergent.data import DictDataset
    from convergent.optim import HORST
    from tests.conftest import tiny_regression_transformer

    model = tiny_regression_transformer()
    generator = torch.Generator().manual_seed(0)
    data = DictDataset(
        {"inputs": torch.randn(32, 5, 4, generator=generator), "labels": torch.randn(32, 3)}
    )
    # A finite loss with a NaN gradient: the optimizer's guard refuses the step.
    next(model.parameters()).register_hook(lambda grad: grad * math.nan)
    optimizer = HORST(model.parameters(), lr=1e-3, alpha=10.0)
    recipe = sparsity_runs.Recipe({}, steps=4, batch_size=8)
    assert sparsity_runs.fit_recipe(model, optimizer, data, recipe, 0, task="regression") == (
        False,
        None,
    )


def test_move_ratio_recorder_records_every_twentieth_step():
    model = torch.nn.Linear(3, 2)
    optimizer = sparsity_runs.HORST(model.parameters(), lr=0.01)
    recorder = sparsity_runs.MoveRatioRecorder(optimizer, 40 // sparsity_runs.MOVE_RATIO_RECORDS)
    for step in range(1, 41):
        model(torch.randn(4, 3)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        recorder.on_step_end(step, {})
    assert len(recorder.values) == 20
    assert recorder.mean == pytest.approx(sum(recorder.values) / 20)
    assert sparsity_runs.MoveRatioRecorder(optimizer, 0).every == 1


def test_move_ratio_recorder_reads_ham_with_ham_move_ratio():
    from convergent.optim import build_optimizer, ham_move_ratio

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = build_optimizer("ham", model.parameters(), lr=0.01, alpha=400.0)
    recorder = sparsity_runs.MoveRatioRecorder(optimizer, 1)
    for step in range(1, 4):
        optimizer.zero_grad()
        model(torch.randn(4, 3)).square().sum().backward()
        optimizer.step()
        recorder.on_step_end(step, {})
        assert recorder.values[-1] == ham_move_ratio(optimizer) > 0.0
    assert sparsity_runs._recorders(optimizer, 40)[0].every == 2
    assert sparsity_runs._recorders(torch.optim.AdamW(model.parameters()), 40) == []


def test_initial_strength_is_alpha_times_the_mean_magnitude_of_the_matrices():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[0.1, -0.2], [0.3, -0.4]]))
        model[1].weight.copy_(torch.tensor([[0.5, -0.6]]))
    optimizer = sparsity_runs.study_optimizer(
        "horst", model, {"weight_decay": 0.0, "alpha": 2.0, "lr": 1e-3}
    )
    # The biases are not mirrored; the six matrix entries average 0.35.
    assert sparsity_runs.initial_strength(optimizer) == pytest.approx(2.0 * 2.1 / 6)
    adamw = sparsity_runs.study_optimizer("adamw", model, {"weight_decay": 0.0, "lr": 1e-3})
    assert sparsity_runs.initial_strength(adamw) is None


def test_calibration_reads_a_fixed_draw_of_training_windows_and_no_labels():
    from convergent.data import DictDataset

    windows = torch.arange(40 * 4).reshape(40, 4)
    train = DictDataset({"input_ids": windows, "labels": windows + 1})
    batches = sparsity_runs.calibration_batches(train, 10)
    assert all(set(batch) == {"input_ids"} for batch in batches)
    drawn = torch.cat([batch["input_ids"] for batch in batches])
    assert drawn.shape == (10, 4) and len({int(row[0]) for row in drawn}) == 10
    assert torch.equal(
        drawn, torch.cat([b["input_ids"] for b in sparsity_runs.calibration_batches(train, 10)])
    )
    assert all(any(torch.equal(row, w) for w in windows) for row in drawn)


def test_modes_and_bad_values():
    full = Config.for_mode("full")
    # Design 3: seeds no earlier design read (designs 1-2 used 0-5), the pilot's selection seed.
    assert full.seeds == (21, 22, 23, 24, 25) and full.selection_seed == 20
    assert full.horst_alphas == (3.0, 10.0, 30.0, 100.0)
    assert full.sparsities == (0.7, 0.8, 0.9) and full.selection_sparsity == 0.9
    sizes = {len(list(itertools.product(*axes.values()))) for axes in full.grids().values()}
    assert sizes == {12}
    sizes = {len(list(itertools.product(*a.values()))) for a in full.language_grids().values()}
    assert sizes == {10}
    with pytest.raises(ValueError, match="mode must be one of"):
        Config.for_mode("huge")
    with pytest.raises(ValueError, match=r"every sparsity must be in \(0, 1\), got 1.2"):
        Config(sparsities=(1.2,))
    with pytest.raises(ValueError, match="optimizers must be among"):
        Config(optimizers=("sgd",))
    with pytest.raises(ValueError, match="lm_pruners must be among magnitude, wanda, sparsegpt"):
        Config(lm_pruners=("magnitude", "obs"))
    with pytest.raises(ValueError, match="lm_pruners must include 'magnitude'"):
        Config(lm_pruners=("wanda", "sparsegpt"))
    with pytest.raises(ValueError, match="lm_calibration_windows must be at least 1, got 0"):
        Config(lm_calibration_windows=0)
    assert full.lm_pruners == ("magnitude", "wanda", "sparsegpt")
    assert full.lm_calibration_windows == 128
    with pytest.raises(ValueError, match="selection_seed 1 is also a final seed"):
        Config(selection_seed=1, seeds=(1, 2))
    with pytest.raises(ValueError, match="every classifier grid must have the same number"):
        Config(horst_alphas=(10.0, 20.0, 50.0))
    with pytest.raises(ValueError, match="every language grid must have the same number"):
        Config(lm_horst_alphas=(10.0, 20.0, 50.0))
    # The two experiments select separately: their grids may differ in size.
    assert Config(
        horst_alphas=(1.0, 2.0, 3.0),
        ham_alphas=(1.0, 2.0, 3.0),
        adamw_lrs=(1e-3,),
        adamw_weight_decays=(0.0, 0.1, 0.2),
    ).grids()["horst"]["alpha"] == (1.0, 2.0, 3.0)


def test_prune_a_run_folder_and_save_a_sparse_checkpoint(tmp_path):
    from convergent.commands import TrainConfig, build_model, run_training

    config = TrainConfig(
        data="digits",
        model="transformer",
        steps=3,
        batch_size=16,
        d_model=16,
        n_heads=2,
        n_layers=1,
        d_ff=32,
        eval_every=0,
    )
    run_training(config, tmp_path / "run", progress=False)
    summary = prune_run(tmp_path / "run", (0.5, 0.9), save_to=tmp_path / "pruned")
    assert [row["target"] for row in summary["rows"]] == [0.5, 0.9]
    assert summary["rows"][1]["sparsity"] == pytest.approx(0.9, abs=1e-2)
    assert "accuracy" in summary["dense"]
    assert "head.weight" in summary["excluded"]
    from convergent.data import load_splits

    model = build_model(config, load_splits("digits"))
    state = load_checkpoint(tmp_path / "pruned", model)  # weights_only=True
    saved = Masks.from_state_dict(state["masks"])
    rebuilt = Masks.from_weights(model, list(saved))
    for name, mask in saved.items():
        assert torch.equal(rebuilt[name], mask)
    assert state["pruning"]["target"] == 0.9
    text = format_prune_summary(summary)
    assert "| dense |" in text and "pruned checkpoint:" in text and "head.weight" in text
    with pytest.raises(ValueError, match=r"sparsity must be in \[0, 1\), got 2.0"):
        prune_run(tmp_path / "run", (2.0,))


def test_the_full_regime_is_the_one_the_committed_pilot_used():
    from convergent.studies.sparsity import pilot

    record = json.loads(
        Path("docs/results/pilots/sparsity-design3/sparsity-pilot/pilot.json").read_text()
    )
    used = next(row for row in record["regimes"] if row["name"] == record["used"])
    full = Config.for_mode("full")
    shape = {key: value for key, value in used.items() if key in pilot.PILOT_REGIMES[0]}
    assert {key: getattr(full, key) for key in shape if key != "name"} == {
        key: value for key, value in shape.items() if key != "name"
    }
    assert full.selection_seed == record["seed"] == pilot.PILOT_SEED
    assert (full.adamw_lrs, full.adamw_weight_decays) == (
        pilot.PILOT_ADAMW_LRS,
        pilot.PILOT_ADAMW_WEIGHT_DECAYS,
    )
    lr = used["selected"]["lr"]
    assert full.horst_lrs == full.ham_lrs == (lr / 2, lr, 2 * lr)
    assert (full.vit_layers, full.vit_heads, full.acdc_distribution) == (4, 4, "uniform")
