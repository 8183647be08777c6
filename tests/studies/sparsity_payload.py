"""A hand-made design-3 payload of the ``sparsity`` study whose answers are worked out in the
tests: 3 seeds, HORST 2-3 points above AdamW at 90 %, known LM perplexity ratios per pruner and
target (shared by the sparsity claims and summary tests)."""

from __future__ import annotations

from typing import Any

from convergent.studies.sparsity import DESIGN, claims_from_results

SEEDS = [1, 2, 3]
VISION_TUNING = "(a) ViT, AC/DC at the selection sparsity, selection seed"
LANGUAGE_TUNING = "(b) LM, one-shot at the largest target, selection seed"
# Test perplexity per optimizer, pruner and target; ratios HORST / AdamW per seed:
# magnitude 70 %: 0.75, 0.8, 0.7; 90 %: 0.9, 0.75, 1.125; Wanda 70 %: 1.1, 1.08, 1.12;
# 90 %: 0.8, 0.9, 0.7; SparseGPT 70 %: 0.9, 0.92, 0.88; 90 %: 0.95, 1.05, 1.0.
PERPLEXITY = {
    "adamw": {
        "magnitude": {"50%": [5.0] * 3, "70%": [8.0] * 3, "90%": [10.0, 12.0, 8.0]},
        "wanda": {"50%": [4.5] * 3, "70%": [6.0] * 3, "90%": [20.0] * 3},
        "sparsegpt": {"50%": [4.2] * 3, "70%": [5.0] * 3, "90%": [10.0] * 3},
    },
    "horst": {
        "magnitude": {"50%": [5.0] * 3, "70%": [6.0, 6.4, 5.6], "90%": [9.0] * 3},
        "wanda": {"50%": [4.5] * 3, "70%": [6.6, 6.48, 6.72], "90%": [16.0, 18.0, 14.0]},
        "sparsegpt": {"50%": [4.2] * 3, "70%": [4.5, 4.6, 4.4], "90%": [9.5, 10.5, 10.0]},
    },
}
DENSE_PERPLEXITY = {"adamw": 4.0, "horst": 4.1}


def _tuning(sizes: int, records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        name: {"points": [{}] * sizes, "on_edge": [], **record} for name, record in records.items()
    }


def _lm_point(point: dict[str, float], dense: float) -> dict[str, Any]:
    """A stored LM selection point with its dense validation perplexity ``dense``."""
    return {
        **point,
        "validation_perplexity": {"magnitude": {"0%": dense, "90%": 3 * dense}},
        "move_ratio": None,
        "strength": None,
    }


def design4_payload(
    adamw_dense: float = 0.86,
    adamw_90: float = 0.78,
    ham_dense: float = 0.85,
    ham_move: float = 0.5,
    lm_move: float = 0.6,
    adamw_selected_dense: float = 4.0,
) -> dict[str, Any]:
    """The payload (config, data, tuning; no claims yet: see :func:`scored`)."""
    accuracy = {
        "adamw": {"dense": [adamw_dense] * 3, "80%": [0.80, 0.81, 0.79], "90%": [adamw_90] * 3},
        "ham": {"dense": [ham_dense] * 3, "80%": [0.80] * 3, "90%": [0.76, 0.77, 0.75]},
        "horst": {
            "dense": [0.85] * 3,
            "80%": [0.83, 0.82, 0.84],
            "90%": [adamw_90 + 0.02, adamw_90 + 0.025, adamw_90 + 0.03],
        },
    }
    perplexity = {
        name: {
            pruner: {"0%": [DENSE_PERPLEXITY[name]] * 3, **by_key}
            for pruner, by_key in by_pruner.items()
        }
        for name, by_pruner in PERPLEXITY.items()
    }
    return {
        "name": "sparsity",
        "mode": "full",
        "config": {
            "mode": "full",
            "seeds": SEEDS,
            "selection_seed": 0,
            "optimizers": ["adamw", "ham", "horst"],
            "sparsities": [0.8, 0.9],
            "lm_optimizers": ["adamw", "horst"],
            "lm_sparsities": [0.5, 0.7, 0.9],
            "lm_pruners": ["magnitude", "wanda", "sparsegpt"],
            "lm_calibration_windows": 128,
            "vit_layers": 4,
            "vit_d_model": 16,
            "vit_steps": 1000,
            "lm_layers": 2,
            "lm_d_model": 128,
            "lm_steps": 1000,
        },
        "data": {
            "design": DESIGN,
            "rms_fraction": 0.01,
            "vision": {
                "selected": {
                    "adamw": {"lr": 0.016, "weight_decay": 0.1},
                    "ham": {"lr": 0.03, "alpha": 50.0},
                    "horst": {"lr": 0.01, "alpha": 3.0},
                },
                "accuracy": accuracy,
                "achieved": {n: {"80%": [0.8] * 3, "90%": [0.9] * 3} for n in accuracy},
                "move_ratio": {
                    "horst": {"dense": [0.5] * 3, "80%": [0.4] * 3, "90%": [0.3] * 3},
                    "ham": {"dense": [0.6] * 3, "80%": [0.5] * 3, "90%": [ham_move] * 3},
                },
                "strength": {"horst": [0.06] * 3},
                "near_zero_share": {
                    "adamw": [0.008, 0.009, 0.010],
                    "horst": [0.02, 0.03, 0.025],
                    "ham": [0.01] * 3,
                },
            },
            "language": {
                "selected": {
                    "adamw": {"lr": 0.003, "weight_decay": 0.1},
                    "horst": {"lr": 0.001, "alpha": 100.0},
                },
                # Each grid's dense validation perplexity (magnitude's 0 %): the best is
                # AdamW's 4.0, so the floor is 4.4; each selected point is within it.
                "selection": {
                    "adamw": [
                        _lm_point({"lr": 0.001, "weight_decay": 0.1}, 4.3),
                        _lm_point({"lr": 0.003, "weight_decay": 0.1}, adamw_selected_dense),
                    ],
                    "horst": [
                        _lm_point({"lr": 0.001, "alpha": 100.0}, 4.2),
                        _lm_point({"lr": 0.003, "alpha": 300.0}, 5.0),  # outside the floor
                    ],
                },
                "perplexity": perplexity,
                "move_ratio": {"horst": [lm_move] * 3},
                "strength": {"horst": [0.25] * 3},
                "near_zero_share": {"adamw": [0.008, 0.009, 0.010], "horst": [0.02, 0.025, 0.03]},
            },
        },
        "tuning": {
            VISION_TUNING: _tuning(
                12,
                {
                    "adamw": {"grid": {"lr": [0.004, 0.016], "weight_decay": [0.01, 0.1]}},
                    "ham": {"grid": {"lr": [0.01, 0.03], "alpha": [50.0, 200.0]}},
                    "horst": {
                        "grid": {"lr": [0.003, 0.01, 0.03], "alpha": [3.0, 10.0]},
                        "selected": {"lr": 0.01, "alpha": 3.0},
                        "on_edge": ["alpha"],
                    },
                },
            ),
            LANGUAGE_TUNING: _tuning(
                10,
                {
                    "adamw": {"grid": {"lr": [0.001, 0.003], "weight_decay": [0.1]}},
                    "horst": {
                        "grid": {"lr": [0.001, 0.003], "alpha": [30.0, 100.0, 300.0]},
                        "selected": {"lr": 0.001, "alpha": 100.0},
                        "on_edge": ["lr"],
                    },
                },
            ),
        },
    }


def scored(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with its claims scored by the study's own scorer (as ``results.json``)."""
    claims = claims_from_results(payload)
    return {**payload, "claims": [claim.to_json() for claim in claims]}
