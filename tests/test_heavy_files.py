"""The list that orders the suite's files for the xdist workers names real files, once each."""

from __future__ import annotations

from pathlib import Path

from tests.heavy_files import HEAVY_FILES, heaviest_first

ROOT = Path(__file__).resolve().parents[1]


def test_every_heavy_file_exists_and_is_listed_once():
    missing = [path for path in HEAVY_FILES if not (ROOT / path).is_file()]
    assert not missing, f"renamed or deleted: {missing}"
    assert len(set(HEAVY_FILES)) == len(HEAVY_FILES)


def test_heavy_files_sort_first_in_their_listed_order_and_the_rest_keep_theirs():
    paths = ["tests/a.py", HEAVY_FILES[1], "tests/b.py", HEAVY_FILES[0], "tests/a.py"]
    keys = heaviest_first(paths)
    assert sorted(paths, key=lambda path: keys[paths.index(path)]) == [
        HEAVY_FILES[0], HEAVY_FILES[1], "tests/a.py", "tests/b.py", "tests/a.py"
    ]  # fmt: skip
