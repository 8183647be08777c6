"""darcy-gen: the finite-difference Darcy solver, the random permeability, and its splits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from convergent.cli import main
from convergent.data import (
    DataSourceError,
    darcy_operator,
    fetch,
    gaussian_random_field,
    generate_darcy,
    load_darcy,
    load_splits,
    random_permeability,
    solve_darcy,
)


def interior_nodes(n: int) -> tuple[np.ndarray, np.ndarray]:
    nodes = np.arange(1, n + 1) / (n + 1)
    return np.meshgrid(nodes, nodes, indexing="ij")


def manufactured_error(n: int, a: float) -> float:
    """Max error for u = sin(pi x) sin(pi y), whose forcing is 2 pi^2 a u for constant a."""
    x, y = interior_nodes(n)
    exact = np.sin(np.pi * x) * np.sin(np.pi * y)
    solution = solve_darcy(np.full((n, n), a), 2 * np.pi**2 * a * exact)
    return float(np.abs(solution - exact).max())


def test_manufactured_solution_converges_at_second_order() -> None:
    coarse, fine = manufactured_error(15, a=2.5), manufactured_error(31, a=2.5)
    assert coarse < 5e-3
    assert 3.5 < coarse / fine < 4.5


def dense_operator(a: np.ndarray) -> np.ndarray:
    """The documented 5-point operator, assembled node by node (boundary faces take a_ij)."""
    n = a.shape[0]
    matrix = np.zeros((n * n, n * n))
    for i in range(n):
        for j in range(n):
            for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                k, m = i + di, j + dj
                inside = 0 <= k < n and 0 <= m < n
                neighbour = a[k, m] if inside else a[i, j]
                face = 2 * a[i, j] * neighbour / (a[i, j] + neighbour) * (n + 1) ** 2
                matrix[i * n + j, i * n + j] += face
                if inside:
                    matrix[i * n + j, k * n + m] -= face
    return matrix


def test_variable_coefficient_matches_a_dense_assembly() -> None:
    generator = np.random.default_rng(0)
    a = np.exp(generator.normal(size=(6, 6)))
    forcing = generator.normal(size=(6, 6))
    dense = dense_operator(a)
    np.testing.assert_allclose(darcy_operator(a).toarray(), dense, rtol=1e-12)
    expected = np.linalg.solve(dense, forcing.ravel()).reshape(6, 6)
    np.testing.assert_allclose(solve_darcy(a, forcing), expected, rtol=1e-10, atol=1e-12)
    assert np.allclose(dense, dense.T) and np.linalg.eigvalsh(dense).min() > 0


def test_solution_invariants() -> None:
    a = random_permeability(10, np.random.default_rng(1))
    u = solve_darcy(a)
    assert u.min() > 0  # discrete maximum principle for a positive forcing
    np.testing.assert_allclose(solve_darcy(a.T), u.T, rtol=1e-10)
    np.testing.assert_allclose(solve_darcy(np.flip(a, 0)), np.flip(u, 0), rtol=1e-10)
    np.testing.assert_allclose(solve_darcy(4.0 * a), u / 4.0, rtol=1e-10)


def test_gaussian_random_field_has_the_documented_covariance() -> None:
    n, draws, alpha, tau = 6, 4000, 2.0, 3.0
    generator = np.random.default_rng(0)
    samples = np.stack(
        [gaussian_random_field(n, generator, alpha=alpha, tau=tau).ravel() for _ in range(draws)]
    )
    x, y = interior_nodes(n)
    expected = np.zeros((n * n, n * n))
    for k1 in range(n):
        for k2 in range(n):
            if k1 == k2 == 0:
                continue
            scale = (np.pi**2 * (k1**2 + k2**2) + tau**2) ** -alpha
            norm = (np.sqrt(2) if k1 else 1) * (np.sqrt(2) if k2 else 1)
            mode = (norm * np.cos(np.pi * k1 * x) * np.cos(np.pi * k2 * y)).ravel()
            expected += scale * np.outer(mode, mode)
    covariance = samples.T @ samples / draws
    assert np.abs(samples.mean(0)).max() < 0.1 * np.sqrt(expected.diagonal().max())
    assert np.abs(covariance - expected).max() < 0.06 * expected.diagonal().max()


def test_random_permeability_is_two_valued_and_balanced() -> None:
    generator = np.random.default_rng(2)
    fields = np.stack([random_permeability(16, generator, high=5.0, low=0.5) for _ in range(200)])
    assert set(np.unique(fields).tolist()) == {0.5, 5.0}
    assert 0.4 < (fields == 5.0).mean() < 0.6  # the field is symmetric about 0


def test_generate_darcy_is_seeded_binary_and_solved() -> None:
    data = generate_darcy(6, 12, seed=3)
    assert data["x"].shape == data["y"].shape == (6, 12, 12)
    assert data["x"].dtype == data["y"].dtype == torch.float32
    assert set(data["x"].unique().tolist()) == {0.0, 1.0}
    assert bool((data["y"] > 0).all())
    again, other = generate_darcy(6, 12, seed=3), generate_darcy(6, 12, seed=4)
    assert torch.equal(again["x"], data["x"]) and torch.equal(again["y"], data["y"])
    assert not torch.equal(other["x"], data["x"])
    coefficient = np.where(data["x"][0].numpy() == 1, 12.0, 3.0)
    np.testing.assert_allclose(data["y"][0].numpy(), solve_darcy(coefficient), rtol=1e-5)


def test_darcy_gen_splits() -> None:
    splits = load_splits("darcy-gen", seed=0, resolution=16, train_size=40, test_size=10)
    assert (splits.task, splits.num_outputs, splits.seq_len, splits.input_dim) == (
        "regression",
        256,
        16,
        16,
    )
    assert [len(part) for part in (splits.train, splits.validation, splits.test)] == [36, 4, 10]
    train = splits.train.tensors
    assert train["inputs"].shape == (36, 16, 16) and train["labels"].shape == (36, 256)
    for values in (train["inputs"], train["labels"]):
        assert abs(float(values.mean())) < 1e-4 and abs(float(values.std()) - 1) < 1e-3
    assert (splits.info["train_seed"], splits.info["test_seed"]) == (0, 1)
    test_inputs = splits.test.tensors["inputs"].flatten(1)
    all_train = torch.cat([train["inputs"], splits.validation.tensors["inputs"]]).flatten(1)
    assert not (test_inputs[:, None] == all_train[None]).all(-1).any()  # test fields are new
    again = load_splits("darcy-gen", seed=0, resolution=16, train_size=40, test_size=10)
    assert torch.equal(again.test.tensors["labels"], splits.test.tensors["labels"])
    small = load_splits("darcy-gen", resolution=12, patch=3, train_size=10, test_size=1)
    assert (small.num_outputs, small.seq_len, small.input_dim) == (144, 16, 9)


def test_darcy_16_splits_still_work_and_inputs_look_alike() -> None:
    # Fetched on first use (a PyPI package), like every other source: never skipped.
    splits = load_splits("darcy-16", seed=0)
    assert [len(part) for part in (splits.train, splits.validation, splits.test)] == [900, 100, 50]
    assert splits.info["resolution"] == 16 and "train_seed" not in splits.info
    # The generated permeability follows the same recipe: half high, similar patch sizes.
    reference, generated = load_darcy()["train_x"], generate_darcy(200, 16, seed=0)["x"]

    def neighbour_agreement(x: torch.Tensor) -> float:
        return float(((x[:, 1:] == x[:, :-1]).float().mean() + (x[..., 1:] == x[..., :-1])
                      .float().mean()) / 2)  # fmt: skip

    assert abs(float(reference.mean()) - float(generated.mean())) < 0.05
    assert abs(neighbour_agreement(reference) - neighbour_agreement(generated)) < 0.05


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: solve_darcy(np.ones((3, 4))), r"shape \(3, 4\).*square"),
        (lambda: solve_darcy(np.ones(5)), r"shape \(5,\).*square"),
        (lambda: solve_darcy(np.array([[1.0, 0.0], [1.0, 1.0]])), "value 0.0 .* > 0"),
        (lambda: solve_darcy(np.full((2, 2), -1.0)), "value -1.0 .* > 0"),
        (lambda: solve_darcy(np.full((2, 2), np.nan)), "value nan .* finite"),
        (lambda: solve_darcy(np.ones((2, 2)), np.ones((3, 3))), r"Forcing shape \(3, 3\)"),
        (lambda: solve_darcy(np.ones((2, 2)), np.inf), "Forcing value inf"),
        (lambda: generate_darcy(2, 1, seed=0), "Resolution 1 .* >= 2"),
        (lambda: generate_darcy(2, 2.5, seed=0), "Resolution 2.5 .* integer"),  # type: ignore[arg-type]
        (lambda: generate_darcy(0, 8, seed=0), "Count 0 .* >= 1"),
        (lambda: random_permeability(8, np.random.default_rng(), low=0), "0 and 12.0 .* > 0"),
        (lambda: load_splits("darcy-gen", resolution=16, patch=5), "Patch size 5 must"),
        (lambda: load_splits("darcy-gen", train_size=5), "train_size 5 .* at least 10"),
        (lambda: load_splits("darcy-gen", test_size=0), "test_size 0 .* at least 1"),
    ],
)
def test_bad_inputs_are_refused_in_one_sentence(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_nothing_to_fetch(temporary_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(DataSourceError, match="generated locally"):
        fetch("darcy-gen")
    assert main(["data", "fetch", "darcy-gen"]) == 0
    assert "nothing to fetch" in capsys.readouterr().out
    assert main(["data", "list"]) == 0
    assert any(
        line.split()[:2] == ["darcy-gen", "generated"]
        for line in capsys.readouterr().out.splitlines()
    )
