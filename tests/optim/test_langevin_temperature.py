"""Langevin's temperature in loss units: posterior_s against the formulas written here, and
`convergent train`'s --langevin-temperature."""

from __future__ import annotations

import re

import pytest

from convergent.commands.config import TrainConfig, langevin_s, optimizer_options
from convergent.data import load_splits
from convergent.optim import describe_temperature, posterior_s


@pytest.mark.parametrize(("examples", "outputs", "sigma2"), [(100, 1, 0.5), (5000, 3, 2e-3)])
def test_the_squared_error_posterior_is_4_sigma2_over_n_k(examples, outputs, sigma2):
    assert posterior_s(examples, outputs, sigma2) == pytest.approx(
        4 * sigma2 / (examples * outputs), rel=1e-15
    )


def test_the_cross_entropy_posterior_is_2_over_n():
    assert posterior_s(55000) == pytest.approx(2 / 55000, rel=1e-15)
    with pytest.raises(ValueError, match="examples must be an integer >= 1, got 0"):
        posterior_s(0)


def test_the_description_reads_s_back_in_each_unit():
    line = describe_temperature(1e-3, 5000, 2)

    def number(label: str) -> float:
        return float(re.search(re.escape(label) + r" = ([0-9.e+-]+)", line).group(1))

    assert number("Langevin s") == pytest.approx(1e-3)
    assert number("2/N") == pytest.approx(2 / 5000, rel=1e-3)
    assert number("sigma^2") == pytest.approx(1e-3 * 5000 * 2 / 4, rel=1e-3)  # s N K / 4
    assert f"{1e-3 / (2 / 5000):.3g}x the cross-entropy posterior" in line
    assert f"temperature {1e-3 / 2:.3g}" in line


def test_the_cli_temperature_is_a_multiple_of_the_training_sets_posterior():
    splits = load_splits("digits", seed=0)
    config = TrainConfig(data="digits", model="transformer", optimizer="langevin",
                         langevin_temperature=0.01)  # fmt: skip
    assert langevin_s(config, splits) == pytest.approx(0.01 * 2 / len(splits.train))
    options = optimizer_options(config, splits)
    assert options["s"] == langevin_s(config, splits) and options["seed"] == config.seed
    given = TrainConfig(data="digits", model="transformer", optimizer="langevin", langevin_s=3e-4)
    assert langevin_s(given, splits) == 3e-4


def test_langevin_needs_one_temperature():
    with pytest.raises(ValueError, match="needs exactly one of langevin_s"):
        TrainConfig(optimizer="langevin")
    with pytest.raises(ValueError, match="needs exactly one of langevin_s"):
        TrainConfig(optimizer="langevin", langevin_s=1e-3, langevin_temperature=1.0)
    with pytest.raises(ValueError, match="give horst_strength or horst_alpha, not both"):
        TrainConfig(optimizer="horst", horst_strength=0.2, horst_alpha=3.0)
