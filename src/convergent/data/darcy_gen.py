"""``darcy-gen``: Darcy-flow pairs made on demand by a finite-difference solver.

The generated counterpart of ``darcy-16``, at any resolution: a two-valued permeability a
drawn as a thresholded Gaussian random field (the recipe of Li et al., "Fourier Neural
Operator for Parametric Partial Differential Equations", 2021), and the pressure u solving

    -div(a grad u) = f  on the unit square,  u = 0 on its boundary,

on the n x n interior nodes ((i + 1) h, (j + 1) h), h = 1 / (n + 1). Entry [i, j] of every
field is the value at that node, axis 0 along the first coordinate.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse
import scipy.sparse.linalg
import torch
from tqdm.auto import tqdm

# The two permeability values of Li et al.'s Darcy data.
HIGH_PERMEABILITY = 12.0
LOW_PERMEABILITY = 3.0


def _check_resolution(resolution: int) -> None:
    if isinstance(resolution, bool) or not isinstance(resolution, int) or resolution < 2:
        raise ValueError(f"Resolution {resolution!r} is out of range; it must be an integer >= 2.")


def darcy_operator(coefficient: np.ndarray) -> scipy.sparse.csr_matrix:
    """The 5-point finite-difference matrix A of -div(a grad u) with u = 0 on the boundary.

    With a_{i+1/2,j} = 2 a_ij a_{i+1,j} / (a_ij + a_{i+1,j}) (the harmonic mean, exact for a
    layered medium) on each face between two nodes,

        (A u)_ij = sum over the 4 faces (a_face / h^2) (u_ij - u_neighbour),

    where a neighbour on the boundary has u = 0 and its face takes a_ij (the field is
    extended to the boundary by its nearest value). A is symmetric positive definite.

    Args:
        coefficient: a [n, n] at the interior nodes, finite and > 0.

    Returns:
        A as a [n * n, n * n] CSR matrix; node [i, j] is unknown i * n + j.
    """
    a = np.asarray(coefficient, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 1:
        raise ValueError(
            f"Coefficient shape {a.shape} is not allowed; it must be a square 2-D array (n, n)."
        )
    bad = a[~(np.isfinite(a) & (a > 0))]
    if bad.size:
        raise ValueError(
            f"Coefficient value {bad[0]} is out of range; every value must be finite and > 0."
        )
    n = a.shape[0]
    inverse_h2 = float((n + 1) ** 2)

    def harmonic(left: np.ndarray, right: np.ndarray) -> np.ndarray:
        return 2.0 * left * right / (left + right)

    padded = np.pad(a, 1, mode="edge")
    faces_0 = harmonic(padded[:-1, 1:-1], padded[1:, 1:-1]) * inverse_h2  # [n + 1, n]
    faces_1 = harmonic(padded[1:-1, :-1], padded[1:-1, 1:]) * inverse_h2  # [n, n + 1]
    diagonal = faces_0[:-1] + faces_0[1:] + faces_1[:, :-1] + faces_1[:, 1:]
    index = np.arange(n * n).reshape(n, n)
    pairs = [
        (index[:-1, :], index[1:, :], faces_0[1:-1]),  # (i, j) -- (i + 1, j)
        (index[:, :-1], index[:, 1:], faces_1[:, 1:-1]),  # (i, j) -- (i, j + 1)
    ]
    rows = [index.ravel()] + [p.ravel() for p, q, _ in pairs] + [q.ravel() for p, q, _ in pairs]
    columns = [index.ravel()] + [q.ravel() for p, q, _ in pairs] + [p.ravel() for p, q, _ in pairs]
    values = [diagonal.ravel()] + [-w.ravel() for *_, w in pairs] * 2
    matrix = scipy.sparse.coo_matrix(
        (np.concatenate(values), (np.concatenate(rows), np.concatenate(columns))),
        shape=(n * n, n * n),
    )
    return matrix.tocsr()


def solve_darcy(coefficient: np.ndarray, forcing: float | np.ndarray = 1.0) -> np.ndarray:
    """Solve -div(a grad u) = f on the unit square with u = 0 on the boundary.

    Second-order finite differences (``darcy_operator``), solved directly with
    ``scipy.sparse.linalg.spsolve``.

    Args:
        coefficient: the permeability a [n, n] at the interior nodes, finite and > 0.
        forcing: f, a scalar or [n, n] at the same nodes (default 1, as in darcy-16).

    Returns:
        u [n, n] (float64) at the interior nodes ((i + 1) h, (j + 1) h), h = 1 / (n + 1).
    """
    matrix = darcy_operator(coefficient)
    n = np.shape(coefficient)[0]
    values = np.asarray(forcing, dtype=np.float64)
    if values.ndim == 0:
        values = np.full((n, n), float(values))
    if values.shape != (n, n):
        raise ValueError(
            f"Forcing shape {values.shape} does not match the coefficient; it must be a scalar "
            f"or an array of shape {(n, n)}."
        )
    bad = values[~np.isfinite(values)]
    if bad.size:
        raise ValueError(f"Forcing value {bad[0]} is not allowed; every value must be finite.")
    return np.asarray(scipy.sparse.linalg.spsolve(matrix, values.ravel())).reshape(n, n)


def gaussian_random_field(
    resolution: int, generator: np.random.Generator, *, alpha: float = 2.0, tau: float = 3.0
) -> np.ndarray:
    """A zero-mean Gaussian random field with covariance (-Laplacian + tau^2 I)^(-alpha).

    The Laplacian has Neumann boundary conditions on the unit square, so its eigenfunctions
    are phi_k(x, y) = c_k1 c_k2 cos(pi k1 x) cos(pi k2 y) (c_0 = 1, c_k = sqrt(2)) with
    eigenvalues pi^2 |k|^2, and the field is drawn spectrally:

        g = sum over 0 <= k1, k2 < n, k != 0 of (pi^2 |k|^2 + tau^2)^(-alpha / 2) xi_k phi_k,

    xi_k independent standard normals; the constant mode is left out, as in Li et al. (whose
    extra factor tau^(alpha - 1) only rescales g). Evaluated exactly at the interior nodes.

    Args:
        resolution: n, the nodes per side (>= 2).
        generator: the numpy random generator to draw xi from.
        alpha: the smoothness exponent (> 0).
        tau: the inverse length scale (> 0).

    Returns:
        g [n, n] (float64).
    """
    _check_resolution(resolution)
    if not (alpha > 0 and tau > 0):
        raise ValueError(f"alpha {alpha} and tau {tau} are out of range; both must be > 0.")
    nodes = np.arange(1, resolution + 1) / (resolution + 1)
    modes = np.arange(resolution)
    basis = np.cos(np.pi * np.outer(nodes, modes)) * np.where(modes == 0, 1.0, np.sqrt(2.0))
    wavenumbers = np.pi**2 * (modes[:, None] ** 2 + modes[None, :] ** 2)
    scales = (wavenumbers + tau**2) ** (-alpha / 2)
    scales[0, 0] = 0.0
    coefficients = scales * generator.standard_normal((resolution, resolution))
    return basis @ coefficients @ basis.T


def random_permeability(
    resolution: int,
    generator: np.random.Generator,
    *,
    alpha: float = 2.0,
    tau: float = 3.0,
    high: float = HIGH_PERMEABILITY,
    low: float = LOW_PERMEABILITY,
) -> np.ndarray:
    """A two-valued permeability: a = high where g >= 0 and low elsewhere, g a
    ``gaussian_random_field`` (Li et al.'s Darcy recipe: alpha 2, tau 3, values 12 and 3).

    Returns:
        a [n, n] (float64) with values in {low, high}.
    """
    if not (low > 0 and high > 0):
        raise ValueError(f"Permeabilities {low} and {high} are out of range; both must be > 0.")
    field = gaussian_random_field(resolution, generator, alpha=alpha, tau=tau)
    return np.where(field >= 0, high, low)


def generate_darcy(
    count: int, resolution: int, seed: int, *, progress: bool = False
) -> dict[str, torch.Tensor]:
    """``count`` Darcy pairs at ``resolution``: a ``random_permeability`` and its
    ``solve_darcy`` pressure with f = 1, drawn from ``numpy.random.default_rng(seed)``.

    Args:
        count: the number of pairs (>= 1).
        resolution: n, the nodes per side (>= 2).
        seed: the seed; the same seed gives the same pairs.
        progress: show a progress bar.

    Returns:
        {"x": float32 [count, n, n], 1 where a is high and 0 where low (as in darcy-16),
        "y": float32 [count, n, n], the pressure u}.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"Count {count!r} is out of range; it must be an integer >= 1.")
    _check_resolution(resolution)
    generator = np.random.default_rng(seed)
    inputs = np.empty((count, resolution, resolution), dtype=np.float32)
    solutions = np.empty_like(inputs)
    for index in tqdm(range(count), desc="darcy-gen", unit="pair", disable=not progress):
        coefficient = random_permeability(resolution, generator)
        inputs[index] = coefficient == HIGH_PERMEABILITY
        solutions[index] = solve_darcy(coefficient)
    return {"x": torch.from_numpy(inputs), "y": torch.from_numpy(solutions)}
