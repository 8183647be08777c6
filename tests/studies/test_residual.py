from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from convergent.studies import VERDICTS, rescore
from convergent.studies.engine import Unit, select
from convergent.studies.framework import UnitCache, json_ready, run_config, write_study
from convergent.studies.residual import DESIGN, STUDY, Config, claims_from_results, study
from convergent.studies.residual import runs as unit_runs
from convergent.studies.residual.measures import (
    Regime,
    depth_gaps,
    floor_decades,
    head_and_tail_means,
    smallest_gap_growth,
)
from convergent.studies.residual.models import ScaledResidualOutput, set_residual_coefficient
from convergent.studies.residual.report import plot_speed_against_ratio
from convergent.studies.residual.runs import (
    DepthRun,
    GradientDescentRun,
    plain,
)
from tests.conftest import assert_drawn_figure

COMMITTED = Path(__file__).resolve().parents[2] / "docs/results/residual-full/results.json"


def _tiny_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=8, hidden_dropout_prob=0.0,
    )  # fmt: skip
    return BertModel(config, add_pooling_layer=False).eval()


def test_scaled_residual_at_beta_one_is_bert_and_at_zero_drops_the_input():
    model = _tiny_bert()
    ids = torch.randint(0, 30, (2, 5))
    reference = model(input_ids=ids).last_hidden_state
    assert set_residual_coefficient(model, 1.0) == 4
    torch.testing.assert_close(model(input_ids=ids).last_hidden_state, reference)
    assert {n for n, _ in model.named_parameters()} == {
        n for n, _ in _tiny_bert().named_parameters()
    }
    set_residual_coefficient(model, 0.0)
    output = model.encoder.layer[0].attention.output
    assert isinstance(output, ScaledResidualOutput) and output.beta == 0.0
    h, x = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    torch.testing.assert_close(output(h, x), output.LayerNorm(output.dense(h)))
    assert not torch.allclose(model(input_ids=ids).last_hidden_state, reference)


def test_config_modes_and_bad_values():
    # Design 3 confirms on seeds no earlier design read (design 2: 0-4, selected on 1000-1002).
    full = Config.for_mode("full")
    assert full.seeds == (10, 11, 12, 13, 14)
    assert full.selection_seeds == (1010, 1011, 1012)
    assert not set(full.seeds + full.selection_seeds) & {0, 1, 2, 3, 4, 1000, 1001, 1002}
    assert Config.for_mode("full").regimes == ((0.1, 2000), (0.01, 6000))
    assert Config.for_mode("quick").seeds == (0,)
    assert Config.for_mode("quick").betas == (0.0, 0.25, 0.5, 0.75, 1.0)
    assert Config.for_mode("quick").depths == (2, 6, 10)
    with pytest.raises(ValueError, match=r"beta=1.5 is out of range"):
        Config(betas=(0.0, 1.5))
    with pytest.raises(ValueError, match="mode must be one of"):
        Config.for_mode("huge")
    with pytest.raises(ValueError, match=r"regime \(lr=0.0, steps=100\) is out of range"):
        Config(regimes=((0.0, 100),))
    with pytest.raises(ValueError, match=r"transient_fraction=0\.5 is out of range"):
        Config(transient_fraction=0.5)


# --- measurement functions, against answers worked out by hand -------------------------------


def test_head_and_tail_means_use_a_tenth_of_the_steps():
    # 20 steps: the first and last 2 -> (0 + 1) / 2 and (18 + 19) / 2.
    assert head_and_tail_means([float(v) for v in range(20)]) == (0.5, 18.5)
    # 5 steps: a tenth rounds down to 0, so one step each.
    assert head_and_tail_means([4.0, 9.0, 9.0, 9.0, 2.0]) == (4.0, 2.0)
    # 200 steps as in full mode: 20 each; JSON's "nan" strings are read as numbers.
    losses = [1.0] * 20 + ["nan"] * 160 + [0.25] * 20
    assert head_and_tail_means(losses) == (1.0, 0.25)


def test_floor_decades_and_gap_growth():
    rows = [
        {"beta": 0.0, "residual_sigma_min_min": 1e-4},
        {"beta": 0.5, "residual_sigma_min_min": 0.3},
        {"beta": 1.0, "residual_sigma_min_min": 0.1},
    ]
    assert floor_decades(rows) == pytest.approx(3.0)  # min(0.3, 0.1) / 1e-4 = 10^3
    assert math.isnan(floor_decades(rows[1:]))  # no beta = 0 run
    assert smallest_gap_growth({2: 0.1, 6: 0.3, 10: 0.25}) == pytest.approx(-0.05)
    assert smallest_gap_growth({10: 0.5, 2: 0.1, 6: 0.3}) == pytest.approx(0.2)
    assert math.isnan(smallest_gap_growth({2: 0.1}))
    runs = [
        {"depth": 2, "beta": 0.0, "losses": [0.9] * 10},
        {"depth": 2, "beta": 1.0, "losses": [0.5] * 9 + [0.3]},
    ]
    assert depth_gaps(runs) == {2: pytest.approx(0.6)}  # tail of 1 step: 0.9 - 0.3


def test_unit_values_survive_a_weights_only_load(tmp_path):
    gd = GradientDescentRun(
        beta=0.5, seed=3, lr=0.1, steps=1, losses=[1.0, math.nan], spectra_steps=[0, 1],
        sigma_min=[0.1, 0.2],
        sigma_max=[1.0, 2.0], residual_sigma_min=[0.3, 0.4], residual_sigma_max=[1.5, 2.5],
        squared_ratio=[0.01, 0.01], residual_squared_ratio=[0.04, 0.03], diverged=True,
        seconds=1.5,
    )  # fmt: skip
    depth = DepthRun(2, 1.0, 3, "pretrained layers 0-1", [0.7, 0.6], 0.25, 0.55, 4.0)
    torch.save({"gd": plain(gd), "depth": plain(depth)}, tmp_path / "u.pt")
    loaded = torch.load(tmp_path / "u.pt", weights_only=True)
    rebuilt = GradientDescentRun(**loaded["gd"])
    assert math.isnan(rebuilt.losses[1])
    assert replace(rebuilt, losses=[1.0]) == replace(gd, losses=[1.0])
    assert DepthRun(**loaded["depth"]) == depth


# --- the committed full-mode results ------------------------------------------------------


def test_rescore_of_the_committed_folder(tmp_path):
    folder = tmp_path / "residual-full"
    (folder / "history").mkdir(parents=True)
    for path in (COMMITTED.parent / "history").glob("design*.results.json"):
        (folder / "history" / path.name).write_bytes(path.read_bytes())
    committed = COMMITTED.read_text()
    (folder / "results.json").write_text(committed)
    result = rescore(folder)
    written = json.loads((folder / "results.json").read_text())
    # Rescoring the committed data gives the committed claims, to the letter.
    assert written["claims"] == json.loads(committed)["claims"]
    assert [c["verdict"] for c in written["claims"]] == [c.verdict for c in result.claims]
    report = (folder / "report.md").read_text()
    # Design 3's own run (seeds 10-14): its verdicts confirm, none is exploratory.
    for claim in result.claims:
        assert f"| {claim.statement} | `{claim.key}` | {claim.verdict} |" in report
    # Design 2's verdicts, as scored then and rescored by design 3's tests (exploratory), stand
    # beside design 3's on its new seeds.
    history = report.partition("## Verdicts across designs")[2]
    assert (
        "| design 2, seeds 0-4, as scored then, Holm's adjustment over its parts added now | design 3's tests on design 2's seeds 0-4 | "
        "design 3's tests on seeds 10-14 |"
    ) in history
    speed = "| `residual.speeds_up_with_beta_lr_0p1` | — | "
    assert f"{speed}reproduced: 0.3362 [0.2024, 0.4699] | inconclusive (exploratory): " in history


# --- runs ---------------------------------------------------------------------------------


def _assert_preview_claims(claims) -> None:
    assert len(claims) == 11  # 3 per regime (2 fixed, 1 tuned), the sigma_min floor, depth
    for claim in claims:
        assert claim.checks, claim.statement
        assert claim.n == 1 and claim.preview
        assert claim.verdict in VERDICTS
        assert claim.interval is None
        assert claim.effect is not None and math.isfinite(claim.effect)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """One smoke run: the report test writes its report, the resume test reruns its units."""
    folder = tmp_path_factory.mktemp("residual-smoke")
    return folder, run_config(STUDY, Config.for_mode("smoke"), folder, progress=False)


def test_smoke_run_writes_a_report(smoke_run):
    folder, result = smoke_run
    report = write_study(result, folder)
    assert report.is_file()
    payload = json.loads((folder / "results.json").read_text())
    assert payload["name"] == "residual"
    assert payload["data"]["design"] == DESIGN
    _assert_preview_claims(result.claims)
    assert not any(claim.exploratory for claim in result.claims)
    # run() scores its claims with the same function a rescore uses.
    assert [c.to_json() for c in claims_from_results(payload)] == payload["claims"]
    for figure in result.figures:
        assert_drawn_figure(folder / figure)
    one_layer = result.data["one_layer_runs"]
    assert [(run["lr"], run["beta"]) for run in one_layer] == [
        (0.1, 0.0), (0.1, 0.5), (0.1, 1.0), (0.01, 0.0), (0.01, 0.5), (0.01, 1.0),
    ]  # fmt: skip
    for entry in one_layer:
        assert len(entry["losses"]) == 31
        assert all(math.isfinite(value) for value in entry["losses"])
    # beta X + Attn(X) at beta = 0 is Attn(X) itself.
    zero = one_layer[0]
    assert zero["residual_sigma_min"] == pytest.approx(zero["sigma_min"])
    # Tuning: every (beta, lr) of the grid once; the selected lr has the lowest final loss.
    tuning = result.data["lr_tuning"]
    assert sorted((row["beta"], row["lr"]) for row in tuning) == [
        (beta, lr) for beta in (0.0, 0.5, 1.0) for lr in (0.1, 0.3)
    ]
    tuned = result.data["tuned_runs"]
    for beta in (0.0, 0.5, 1.0):
        rows = [row for row in tuning if row["beta"] == beta]
        best = min(
            (r for r in rows if math.isfinite(r["final_loss"])), key=lambda r: r["final_loss"]
        )["lr"]
        assert [row["lr"] for row in rows if row["selected"]] == [best]
        assert [(run["lr"], run["steps"]) for run in tuned if run["beta"] == beta] == [(best, 30)]
    depth = result.data["depth_runs"]
    assert {(run["depth"], run["beta"]) for run in depth} == {
        (1, 0.0),
        (1, 1.0),
        (2, 0.0),
        (2, 1.0),
    }
    assert all(len(run["losses"]) == 3 for run in depth)


def _selected_step_size(rows, lrs):
    """The step size the study's selection (run by the engine) picks from ``rows`` (one per
    step size and selection seed, each row its unit's value), with the grid ``lrs`` in the
    config's order."""
    seeds = tuple(sorted({row["seed"] for row in rows}))
    config = Config(betas=(0.0, 1.0), tuned_lrs=lrs, selection_seeds=tuple(1000 + s for s in seeds))
    values = {(row["lr"], 1000 + row["seed"]): row for row in rows}

    def unit(name, point):
        row = values[point["lr"], point["seed"]]
        value = {**row, "beta": 0.0, "seed": point["seed"], "losses": [row["final_loss"]]}
        return Unit(dict(point), dict, (value,))

    selection = replace(study.step_size_selection(config), unit=unit)
    cache = UnitCache(Path("unused"), "residual", {}, enabled=False)
    selected = select(selection, cache, 1, lambda line: None)
    return study.selected_step_size(selected.tunings["beta=0.0"])


def test_step_size_selection_takes_the_best_worst_case_over_seeds():
    def row(lr, seed, loss):
        return {"lr": lr, "seed": seed, "final_loss": loss, "diverged": not math.isfinite(loss)}

    rows = [
        row(1.0, 0, 0.01), row(1.0, 1, math.inf),  # best on seed 0, diverged from seed 1
        row(0.5, 0, 0.10), row(0.5, 1, 0.30),  # worst case 0.30
        row(0.2, 0, 0.25), row(0.2, 1, 0.20),  # worst case 0.25: selected
        row(0.1, 0, 0.25), row(0.1, 1, 0.25),  # the same worst case as 0.2
    ]  # fmt: skip
    assert _selected_step_size(rows[:6], (1.0, 0.5, 0.2)) == 0.2
    # A tie in the worst case goes to the smaller step, whatever the grid's order.
    assert _selected_step_size(rows, (1.0, 0.5, 0.2, 0.1)) == 0.1
    assert _selected_step_size(rows, (0.2, 0.1, 0.5, 1.0)) == 0.1
    # A run flagged diverged counts as lost even with a finite last loss.
    flagged = [{**rows[4], "diverged": True}, rows[5], rows[2], rows[3]]
    assert _selected_step_size(flagged, (0.2, 0.5)) == 0.5
    assert math.isnan(_selected_step_size(rows[:2], (1.0,)))


def test_the_selection_seeds_must_not_be_reported_seeds():
    with pytest.raises(ValueError, match=r"selection_seeds=\(1, 7\) share \[1\] with seeds"):
        Config(seeds=(0, 1), selection_seeds=(1, 7))
    with pytest.raises(ValueError, match="selection_seeds is empty"):
        Config(selection_seeds=())


def test_the_speed_plot_draws_when_every_run_diverged(tmp_path):
    runs = [
        plain(GradientDescentRun(beta, 0, 0.1, 4, losses=[1.0, math.inf], diverged=True))
        | {"residual_sigma_min": [0.1], "squared_ratio": [0.1], "residual_squared_ratio": [0.1]}
        for beta in (0.0, 1.0)
    ]
    config = {"seeds": [0], "transient_fraction": 0.1}
    regime = Regime.of(config, runs, 0.1, 4)
    assert_drawn_figure(plot_speed_against_ratio(regime, tmp_path / "speed.png"))


def test_smoke_run_resumes_from_its_units(smoke_run, tmp_path, monkeypatch):
    config = Config.for_mode("smoke")
    folder, first = smoke_run  # its units, copied: this test adds units of a changed config
    shutil.copytree(folder / "units", tmp_path / "units")
    units = sorted((tmp_path / "units").glob("*.pt"))
    # 2 regimes x 3 betas, 2 tuning lrs x 3 betas, 3 tuned runs, 2 depths x 2 betas; one seed
    assert len(units) == 6 + 6 + 3 + 4
    stamps = [path.stat().st_mtime_ns for path in units]

    def refuse(*args, **kwargs):
        raise AssertionError("a finished unit was computed again")

    monkeypatch.setattr(unit_runs, "train_one_beta", refuse)
    monkeypatch.setattr(unit_runs, "train_one_depth", refuse)
    second = run_config(STUDY, config, tmp_path, progress=False)
    assert [c.to_json() for c in second.claims] == [c.to_json() for c in first.claims]
    assert json_ready(second.data) == json_ready(first.data)
    assert second.tables == first.tables
    assert [path.stat().st_mtime_ns for path in units] == stamps

    # A field that changes what a unit computes makes every unit new.
    monkeypatch.undo()
    computed: list[str] = []
    for name in ("train_one_beta", "train_one_depth"):
        original = getattr(unit_runs, name)

        def counting(*args, _original=original, _name=name, **kwargs):
            computed.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(unit_runs, name, counting)
    changed = run_config(STUDY, replace(config, regimes=((0.05, 30),)), tmp_path, progress=False)
    assert sorted(computed) == ["train_one_beta"] * (3 + 6 + 3) + ["train_one_depth"] * 4
    assert len(list((tmp_path / "units").glob("*.pt"))) == 19 + 16
    assert changed.data["one_layer_runs"][1]["losses"] != first.data["one_layer_runs"][1]["losses"]


@pytest.mark.slow
def test_quick_run(tmp_path):
    """The residual study at quick size (163 s of CI's 18 min: `make run` runs it, and the smoke
    tests above run the same code on the same data at smaller sizes)."""
    result = run_config(STUDY, Config.for_mode("quick"), tmp_path, progress=False)
    write_study(result, tmp_path)
    _assert_preview_claims(result.claims)
    assert all(check.value is not None for claim in result.claims for check in claim.checks)
    payload = json.loads((tmp_path / "results.json").read_text())
    assert [c.to_json() for c in claims_from_results(payload)] == payload["claims"]


def test_part_a_on_two_workers_matches_one(tmp_path):
    config = replace(Config.for_mode("smoke"), run_depth=False, regimes=((0.1, 8),), tuned_steps=8)
    alone = run_config(STUDY, config, tmp_path / "one", progress=False)
    parallel = run_config(STUDY, replace(config, workers=2), tmp_path / "two", progress=False)

    def without_seconds(runs: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in runs]

    for key in ("one_layer_runs", "tuned_runs"):
        assert without_seconds(parallel.data[key]) == without_seconds(alone.data[key])
    assert parallel.data["lr_tuning"] == alone.data["lr_tuning"]
    with pytest.raises(ValueError, match="workers=0 is out of range"):
        replace(config, workers=0)


def test_a_run_that_diverges_on_a_measured_step_ends_diverged_instead_of_crashing():
    # Spectra measured at every step, and a step size that sends the loss to inf within a few
    # steps: the step whose loss is not finite is the first with NaN weights, where the SVD
    # behind the spectra would refuse them.
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(8, 6, 3, generator=generator)
    labels = torch.randn(8, 2, generator=generator)
    found = unit_runs.train_one_beta(
        inputs, labels, 1.0, 0, window=6, d_model=8, d_ff=16, init_std=0.3, steps=50,
        lr=1e6, spectra_every=1,
    )  # fmt: skip
    assert found.diverged and not math.isfinite(found.losses[-1])
    assert len(found.spectra_steps) == len(found.losses) - 1  # every finite step measured
    assert all(map(math.isfinite, found.sigma_min))
