"""The files shipped inside the package for the notebooks, found through importlib.resources.

In a checkout, ``dsparklab/lab/notebooks``, ``dsparklab/lab/published`` and
``dsparklab/lab/profiles`` are symbolic links to the top-level ``notebooks/`` (what users
open in JupyterLab), ``data/published/`` and ``data/profiles/`` (cost profiles for
projections); a wheel carries their files as package data (``pyproject.toml``), so each
file has one copy.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from dsparklab.errors import DSparkLabError

PUBLISHED_SPEEDUPS = "published_kimi_dspark.csv"
PUBLISHED_CURVES = "published_position_curves.csv"
PUBLISHED_VERIFY_COSTS = "published_verify_costs.csv"


def _shipped(name: str) -> Path:
    resource = files("dsparklab.lab").joinpath(name)
    if not isinstance(resource, Path) or not resource.is_dir():
        raise DSparkLabError(
            f"dsparklab is installed without its {name} ({resource} is missing); reinstall "
            "it from a checkout or a wheel"
        )
    return resource


def notebooks_dir() -> Path:
    """The directory of the notebooks shipped with the package (``NN_*.ipynb``)."""
    return _shipped("notebooks")


def published_file(name: str) -> Path:
    """A published table shipped with the package (:data:`PUBLISHED_SPEEDUPS`, ...)."""
    return _shipped("published") / name


def cost_profile_file(name: str) -> Path:
    """A cost profile shipped with the package (``assumed-gpu-like`` ->
    ``profiles/assumed-gpu-like.json``)."""
    return _shipped("profiles") / f"{name}.json"


def shipped_cost_profiles() -> list[str]:
    """The names of the cost profiles shipped with the package."""
    return sorted(p.stem for p in _shipped("profiles").glob("*.json"))
