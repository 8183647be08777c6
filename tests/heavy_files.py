"""The suite's heaviest test files, heaviest first: they start first on the xdist workers.

With ``--dist loadfile`` a file runs whole on one worker, and the workers take files in the
order the collection lists them (``--no-loadscope-reorder`` in pyproject.toml: xdist would
otherwise sort the files by their number of tests, which put the README's few long tests
last, one worker running them while the other idled). Heaviest first, the light files fill
the gaps at the end (longest processing time first).

The order is a measurement: seconds per file from ``--junitxml`` of the default pass on 2
workers (loaded machine, 2026-12-07); a file made lighter since is that figure times its
CPU seconds after over before the change (``x 0.50``: each file run alone, back to back). A
file missing here runs after these in collection order, so a stale list costs balance, never
a test.
"""

from __future__ import annotations

HEAVY_FILES = (
    "tests/studies/test_sparsity.py",  # 460 s
    "tests/studies/test_canary.py",  # 303 s
    "tests/studies/test_descent.py",  # 293 s
    "tests/faults/test_run_faults.py",  # 265 s (533 s x 0.50)
    "tests/test_readme_commands.py",  # 242 s
    "tests/studies/test_langevin_study.py",  # 225 s
    "tests/studies/test_residual.py",  # 187 s (215 s x 0.87)
    "tests/commands/test_compressed.py",  # 158 s (177 s x 0.89)
    "tests/test_cli.py",  # 151 s
    "tests/test_readme_tour.py",  # 118 s
    "tests/commands/test_from_pretrained.py",  # 118 s
    "tests/commands/test_prune_streamed.py",  # 113 s (308 s x 0.37)
    "tests/studies/test_units.py",  # 96 s
    "tests/studies/test_residual_summary.py",  # 83 s (94 s x 0.88)
    "tests/studies/test_langevin_summary.py",  # 82 s (107 s x 0.77)
    "tests/train/test_checks.py",  # 77 s
    "tests/commands/test_train_sparsity.py",  # 76 s
    "tests/train/test_checks_hf.py",  # 74 s
    "tests/commands/test_hf_folders.py",  # 72 s (101 s x 0.71)
    "tests/commands/test_diagnose.py",  # 70 s
    "tests/sparse/test_kernels.py",  # 68 s
    "tests/numerics/test_mirror_closed_forms.py",  # 64 s
    "tests/commands/test_calibrated_pruning.py",  # 49 s (84 s x 0.58)
    "tests/commands/test_prune_output.py",  # 44 s (65 s x 0.68)
    "tests/commands/test_prune_reports.py",  # 43 s (66 s x 0.65)
)


def heaviest_first(paths: list[str]) -> list[int]:
    """Sort keys for test items by their file's path: a file of ``HEAVY_FILES`` by its rank
    there, every other file after them (a stable sort keeps their collection order)."""
    rank = {path: index for index, path in enumerate(HEAVY_FILES)}
    return [rank.get(path, len(HEAVY_FILES)) for path in paths]
