"""The on-disk cache of data sources: where it lives, checksums, atomic installs.

Every source owns one folder, ``cache_root() / name``. A folder is only ever put in
place whole (staged in a sibling temporary folder, then renamed), so a reader never
sees a half-written source.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

try:  # POSIX only; elsewhere concurrent fetches of one source are simply not serialized.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

CACHE_ENVIRONMENT_VARIABLE = "CONVERGENT_CACHE"


class DataSourceError(RuntimeError):
    """A data source cannot be had: the message says which, why, and what to do."""


class UnknownDataSourceError(DataSourceError, ValueError):
    """A data source name that is not in the registry."""


def cache_root() -> Path:
    """The cache folder: ``$CONVERGENT_CACHE`` if set, else ``~/.cache/convergent``."""
    configured = os.environ.get(CACHE_ENVIRONMENT_VARIABLE)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "convergent"


def source_dir(name: str) -> Path:
    """The cache folder of one source (it may not exist yet)."""
    return cache_root() / name


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    """The hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def checksum_problems(folder: Path, expected: Mapping[str, str]) -> list[str]:
    """Compare the files of ``folder`` with their recorded sha256.

    Args:
        folder: the source folder.
        expected: relative path -> sha256 (hex).

    Returns:
        One human-readable line per missing or mismatching file; empty when all match.
    """
    problems = []
    for relative_path, expected_hash in expected.items():
        path = folder / relative_path
        if not path.is_file():
            problems.append(f"{relative_path} is missing")
            continue
        actual_hash = sha256_file(path)
        if actual_hash != expected_hash:
            problems.append(f"{relative_path} has sha256 {actual_hash}, expected {expected_hash}")
    return problems


def folder_size(folder: Path) -> int:
    """Total size in bytes of the files under ``folder`` (0 if it does not exist)."""
    if not folder.is_dir():
        return 0
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def staging_dir(name: str) -> Path:
    """A fresh temporary folder next to the source's final folder (same file system)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{name}.staging-", dir=root))
    staged.chmod(0o755)  # mkdtemp makes it private; the installed cache folder should not be
    return staged


def install_atomically(staged: Path, final: Path) -> None:
    """Put the folder ``staged`` in place as ``final``, replacing any previous content.

    A directory cannot be renamed over a non-empty one, so an old folder is first
    renamed aside; readers see either the old folder, nothing, or the new one, never a
    mixture.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    retired = None
    if final.exists():
        retired = Path(tempfile.mkdtemp(prefix=f".{final.name}.retired-", dir=final.parent))
        os.replace(final, retired / final.name)
    os.replace(staged, final)
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)


@contextlib.contextmanager
def source_lock(name: str) -> Iterator[None]:
    """Serialize fetches of one source across processes (a no-op where fcntl is missing)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(root / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
