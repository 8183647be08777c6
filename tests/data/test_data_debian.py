"""The Debian-backed sources: fetching through apt without root (on faked commands), and the
real fashion-mnist, austen and street-video sources, fetched once into the default cache."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from convergent.data import (
    SOURCES,
    DataSourceError,
    fetch,
    is_cached,
    load_austen,
    load_fashion_mnist,
    load_splits,
    load_street_video,
    recipes,
)
from convergent.data.parsers import AUSTEN_BOOKS
from convergent.data.recipes import DebianPackage, Member
from convergent.data.sources import DataSource

DEB_CONTENT = b"deb data\n"


def needs_debian_source(name: str) -> None:
    """Skip where the source is neither cached nor obtainable (no apt-get on this machine)."""
    if shutil.which("apt-get") is None and not is_cached(name):
        pytest.skip(f"{name} needs apt-get (a Debian or Ubuntu machine) or a cached copy")


class FakeApt:
    """Stands in for ``subprocess.run`` of apt-get and dpkg: records every command; apt knows
    the packages in ``known`` only once ``apt-get update`` has run, or from the start when
    ``system_lists`` is true."""

    def __init__(self, system_lists: bool = True, known: tuple[str, ...] = ("pkg",)) -> None:
        self.system_lists = system_lists
        self.known = known
        self.commands: list[list[str]] = []
        self.updated = False
        self.content = DEB_CONTENT

    def __call__(self, command: list[str], cwd: Path, **kwargs: object):
        self.commands.append(command)
        if command[:2] == ["apt-get", "update"]:
            self.updated = True
            return subprocess.CompletedProcess(command, 0, "Reading package lists...\n", "")
        if command[:2] == ["apt-get", "download"]:
            package = command[-1]
            private = any(part.startswith("Dir::State::Lists=") for part in command)
            if package in self.known and (self.system_lists or (private and self.updated)):
                (Path(cwd) / f"{package}_1.0_all.deb").write_bytes(b"!<arch>\n")
                return subprocess.CompletedProcess(command, 0, "", "")
            message = f"E: Unable to locate package {package}\n"
            return subprocess.CompletedProcess(command, 100, "", message)
        if command[:2] == ["dpkg", "-x"]:
            target = Path(command[3]) / "usr/share/pkg"
            target.mkdir(parents=True)
            (target / "data.txt").write_bytes(self.content)
            return subprocess.CompletedProcess(command, 0, "", "")
        raise AssertionError(f"unexpected command {command}")


@pytest.fixture
def fake_apt(temporary_cache: Path, monkeypatch: pytest.MonkeyPatch) -> FakeApt:
    """Register a Debian source "deb" (package "pkg") and fake apt-get and dpkg."""
    apt = FakeApt()
    monkeypatch.setattr(recipes.subprocess, "run", apt)
    recipe = DebianPackage("pkg", (Member(("usr/share/pkg/data.txt",), "data.txt"),))
    digest = hashlib.sha256(DEB_CONTENT).hexdigest()
    monkeypatch.setitem(SOURCES, "deb", DataSource("deb", "test", recipe, {"data.txt": digest}))
    return apt


def apt_commands(apt: FakeApt) -> list[list[str]]:
    return [command for command in apt.commands if command[0] == "apt-get"]


def test_debian_source_refetches_on_checksum_mismatch(
    fake_apt: FakeApt, temporary_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = fetch("deb")
    assert (folder / "data.txt").read_bytes() == DEB_CONTENT
    (folder / "data.txt").write_bytes(b"deb data, bit-flipped\n")
    assert not is_cached("deb")
    with caplog.at_level(logging.WARNING, logger="convergent.data"):
        assert fetch("deb") == folder
    assert (folder / "data.txt").read_bytes() == DEB_CONTENT
    assert any("corrupt" in record.message for record in caplog.records)
    downloads = [command for command in apt_commands(fake_apt) if command[1] == "download"]
    assert len(downloads) == 2
    # apt's binary caches go inside the cache, never to /var/cache/apt.
    assert all(f"Dir::Cache={temporary_cache / '.apt' / 'cache'}" in c for c in downloads)
    assert not (folder / ".download").exists()


def test_upstream_debian_content_that_fails_its_checksum_is_never_installed(
    fake_apt: FakeApt, temporary_cache: Path
) -> None:
    fake_apt.content = b"a newer release\n"
    with pytest.raises(DataSourceError, match=r"'deb'.*does not match its recorded checksums"):
        fetch("deb")
    assert not (temporary_cache / "deb").exists()


def test_fresh_machine_fills_private_package_lists_in_the_cache(
    fake_apt: FakeApt, temporary_cache: Path
) -> None:
    """No system package lists (a fresh container): `apt-get update` into the cache, retry."""
    fake_apt.system_lists = False
    assert (fetch("deb") / "data.txt").read_bytes() == DEB_CONTENT
    lists = temporary_cache / ".apt" / "lists"
    first, update, second = apt_commands(fake_apt)
    assert first[:2] == ["apt-get", "download"] and f"Dir::State::Lists={lists}" not in first
    assert update[:2] == ["apt-get", "update"] and f"Dir::State::Lists={lists}" in update
    assert second[:2] == ["apt-get", "download"] and f"Dir::State::Lists={lists}" in second
    assert (lists / "partial").is_dir()


def test_missing_debian_package_gives_one_clear_error(
    fake_apt: FakeApt, temporary_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_apt.known = ()
    with pytest.raises(DataSourceError) as caught:
        fetch("deb")
    message = str(caught.value)
    assert message.startswith("Data source 'deb' (Debian package pkg) cannot be had:")
    assert "`apt-get download pkg` failed: E: Unable to locate package pkg" in message
    assert str(temporary_cache / ".apt" / "lists") in message
    assert "apt-cache policy pkg" in message and "CONVERGENT_CACHE" in message
    assert "\n" not in message
    assert not (temporary_cache / "deb").exists()
    assert not list(temporary_cache.glob(".deb.staging-*"))


def test_machine_without_apt_says_so(
    fake_apt: FakeApt, temporary_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_such_program(command: list[str], **kwargs: object):
        raise FileNotFoundError(2, "No such file or directory", command[0])

    monkeypatch.setattr(recipes.subprocess, "run", no_such_program)
    monkeypatch.setattr(recipes.shutil, "which", lambda name: None)
    with pytest.raises(DataSourceError, match=r"'deb'.*`apt-get` is not available.*Debian"):
        fetch("deb")


def test_fashion_mnist_parse() -> None:
    needs_debian_source("fashion-mnist")
    data = load_fashion_mnist()
    assert data["train_images"].shape == (60_000, 28, 28)
    assert data["test_images"].shape == (10_000, 28, 28)
    assert data["train_images"].dtype == torch.uint8 and data["train_labels"].dtype == torch.long
    assert data["train_labels"].bincount().tolist() == [6000] * 10
    assert data["test_labels"].bincount().tolist() == [1000] * 10
    assert data["train_images"].min() == 0 and data["train_images"].max() == 255
    assert data["train_labels"][:5].tolist() == [9, 0, 0, 3, 0]  # the published first labels


def test_fashion_mnist_splits() -> None:
    needs_debian_source("fashion-mnist")
    splits = load_splits("fashion-mnist", seed=0)
    assert [len(part) for part in (splits.train, splits.validation, splits.test)] == [
        55_000,
        5_000,
        10_000,
    ]
    assert (splits.task, splits.num_outputs, splits.seq_len, splits.input_dim) == (
        "classification",
        10,
        16,
        49,
    )
    inputs = splits.validation.tensors["inputs"]
    assert inputs.shape == (5_000, 16, 49) and inputs.dtype == torch.float32
    assert inputs.min() >= 0 and inputs.max() <= 1
    indices = splits.info["indices"]
    assert not set(indices["train"].tolist()) & set(indices["validation"].tolist())
    images = load_fashion_mnist()["train_images"]
    first = images[indices["validation"][0]].float() / 255
    assert torch.allclose(inputs[0, 0], first[:7, :7].flatten())  # row-major 7x7 patches

    # The seed alone fixes the split: a private generator, the same on every machine.
    order = torch.randperm(60_000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(indices["validation"], order[:5_000])
    other = load_splits("fashion-mnist", seed=1, size=14, patch=7, validation_size=100)
    assert not torch.equal(other.info["indices"]["validation"], indices["validation"][:100])
    assert other.validation.tensors["inputs"].shape == (100, 4, 49) and other.seq_len == 4
    assert other.train.tensors["inputs"].shape == (59_900, 4, 49)
    with pytest.raises(ValueError, match="Patch size 5 must"):
        load_splits("fashion-mnist", patch=5)
    with pytest.raises(ValueError, match="size 32 is out of range"):
        load_splits("fashion-mnist", size=32)


def test_austen_parse() -> None:
    needs_debian_source("austen")
    books = load_austen()
    assert list(books) == list(AUSTEN_BOOKS.values())
    assert sum(len(text) for text in books.values()) == 4_025_022
    assert books["Emma"].startswith("EMMA\n\nBy Jane Austen\n")
    assert books["Pride & Prejudice"].endswith("had been the means of uniting them.")
    # The decoded copy is kept next to the cached files and read from there next time.
    assert (fetch("austen") / "text" / "emma.txt").read_text(encoding="utf-8") == books["Emma"]
    assert load_austen() == books


def test_austen_lm_splits_have_no_overlap() -> None:
    needs_debian_source("austen")
    splits = load_splits("austen", seed=0, seq_len=64)
    itos = splits.info["itos"]
    assert (splits.task, splits.seq_len) == ("lm", 64)
    assert splits.vocab_size == splits.num_outputs == len(itos) == 81
    assert itos[-1] == "\ufffd" and splits.info["unknown_characters"] == ["£"]
    books = load_austen()
    titles = splits.info["books"]
    ranges = splits.info["char_ranges"]
    for title, text in books.items():
        (train_start, train_stop), (validation_start, validation_stop), (test_start, test_stop) = (
            ranges[name][title] for name in ("train", "validation", "test")
        )
        assert train_start == 0 and test_stop == len(text)
        assert train_stop == validation_start and validation_stop == test_start
        assert validation_stop - validation_start == test_stop - test_start == len(text) // 20
    for name in ("train", "validation", "test"):
        dataset = getattr(splits, name)
        input_ids, labels = dataset.tensors["input_ids"], dataset.tensors["labels"]
        assert input_ids.shape == labels.shape and input_ids.shape[1] == 64
        assert input_ids.dtype == labels.dtype == torch.long
        assert torch.equal(input_ids[:, 1:], labels[:, :-1])
        starts = splits.info["window_starts"][name]
        assert len(starts) == len(dataset)
        book, offset = starts[:, 0], starts[:, 1]
        low = torch.tensor([ranges[name][title][0] for title in titles])
        high = torch.tensor([ranges[name][title][1] for title in titles])
        # Every window, with its last target, lies inside its split's block of its novel.
        assert bool(((offset >= low[book]) & (offset + 65 <= high[book])).all())
        book, offset = starts[len(starts) // 2].tolist()
        window = "".join(itos[i] for i in input_ids[len(starts) // 2])
        assert window == books[titles[book]][offset : offset + 64].replace("£", "\ufffd")
    with pytest.raises(ValueError, match="seq_len 0 is out of range"):
        load_splits("austen", seq_len=0)


def test_street_video_first_frames() -> None:
    needs_debian_source("street-video")
    frames = load_street_video(max_frames=8)
    assert frames.shape == (8, 576, 768) and frames.dtype == torch.uint8
    assert 50 < frames.float().mean() < 200 and frames.float().std() > 10
    color = load_street_video(max_frames=2, gray=False)
    assert color.shape == (2, 576, 768, 3)
    assert not torch.equal(color[..., 0], color[..., 2])  # real color, not gray copies
    with pytest.raises(ValueError, match="max_frames 0 is out of range"):
        load_street_video(max_frames=0)


@pytest.mark.slow
def test_street_video_has_795_frames() -> None:
    needs_debian_source("street-video")
    frames = load_street_video()
    assert frames.shape == (795, 576, 768)
    assert not torch.equal(frames[0], frames[-1])


@pytest.mark.slow
def test_real_apt_on_a_machine_without_package_lists(
    temporary_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real download with the system's package lists hidden, as on a fresh container:
    `apt-get update` fills lists inside the cache and nothing outside it is needed."""
    if shutil.which("apt-get") is None:
        pytest.skip("needs apt-get (a Debian or Ubuntu machine)")
    empty_lists = tmp_path / "empty-lists"
    (empty_lists / "partial").mkdir(parents=True)
    configuration = tmp_path / "apt.conf"
    configuration.write_text(f'Dir::State::Lists "{empty_lists}";\n')
    monkeypatch.setenv("APT_CONFIG", str(configuration))
    assert sorted(path.name for path in fetch("austen").iterdir()) == ["Rdata.rdb", "Rdata.rdx"]
    assert list((temporary_cache / ".apt" / "lists").glob("*_Packages*"))
    assert os.listdir(empty_lists) == ["partial"]
