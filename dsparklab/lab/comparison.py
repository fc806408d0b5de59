"""Two run sets a notebook compares prompt by prompt (notebook 05, ``dsparklab compare``):
BASE and NEW as given, or the seeds' regression the runs hold."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from dsparklab.errors import (
    MissingInputError,
)
from dsparklab.lab.runs import (
    TIER_ORDER,
    Runs,
    RunsInput,
    by_status,
    load_runs,
    open_catalog,
    read_statuses,
    token_runs,
)
from dsparklab.store.catalog import Catalog

logger = logging.getLogger(__name__)

# the comparison a notebook makes when BASE and NEW are not given: the seeds' regression
# (one method, its smallest against its largest window), Eagle3 first
COMPARISON_PREFERENCE = ("eagle3", "dspark")


@dataclass(frozen=True)
class Comparison:
    """Two run sets compared prompt by prompt (see :func:`load_comparison`)."""

    base: Runs
    new: Runs
    base_selection: dict[str, Any]
    new_selection: dict[str, Any]

    @property
    def labels(self) -> tuple[str, str]:
        """``("eagle3 n=3", "eagle3 n=7")``: one label per side, from its selection."""
        return (_selection_label(self.base_selection), _selection_label(self.new_selection))


def _selection_label(selection: Mapping[str, Any]) -> str:
    return " ".join(
        f"n={value}" if key == "n" else str(value) if key == "method" else f"{key}={value}"
        for key, value in selection.items()
    )


def default_comparison(table: pd.DataFrame) -> tuple[dict[str, Any], dict[str, Any]]:
    """BASE and NEW from what the runs hold: one method's smallest against its largest
    window (Eagle3 first, then DSpark, then any), else two methods at a shared window.

    ``table`` lists token-level method runs (``method``, ``n``).
    """
    methods = sorted(
        table["method"].unique(),
        key=lambda m: (COMPARISON_PREFERENCE.index(m) if m in COMPARISON_PREFERENCE else 99, m),
    )
    for method in methods:
        ns = sorted({int(n) for n in table.loc[table["method"] == method, "n"]})
        if len(ns) > 1:
            return {"method": method, "n": ns[0]}, {"method": method, "n": ns[-1]}
    by_n = table.groupby("n")["method"].unique()
    for n, present in sorted(by_n.items(), reverse=True):
        ordered = [m for m in methods if m in set(present)]
        if len(ordered) > 1:
            return {"method": ordered[0], "n": int(n)}, {"method": ordered[1], "n": int(n)}
    have = table[["method", "n"]].drop_duplicates().to_dict("records")
    raise MissingInputError(
        f"a comparison needs two run sets (one method at two windows, or two methods at one "
        f"window); the runs hold {have}"
    )


def _choose_comparison(
    catalog: Catalog,
    methods: pd.DataFrame,
    base: Mapping[str, Any] | None,
    new: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """BASE, NEW and the one tier they are read from: the most realistic tier holding BASE,
    or, with no BASE and NEW given, the most realistic one that holds a comparison."""
    by_tier = sorted(methods["tier"].astype(str).unique(), key=lambda t: (TIER_ORDER.get(t, 99), t))
    if base and new:
        held = [t for t in by_tier if catalog.matching(base, methods[methods["tier"] == t]).any()]
        return dict(base), dict(new), held[:1]
    problem = MissingInputError("no runs to compare")
    for tier in by_tier:
        try:
            chosen = default_comparison(methods[methods["tier"] == tier])
        except MissingInputError as err:
            problem = err
            continue
        return chosen[0], chosen[1], [tier]
    raise problem


def load_comparison(
    runs: RunsInput,
    base: Mapping[str, Any] | None = None,
    new: Mapping[str, Any] | None = None,
    *,
    datasets: Sequence[str] = (),
    shipped: bool = False,
    tiers: Sequence[str] = (),
) -> Comparison:
    """The two sides of a comparison, each read with :func:`load_runs` (its steps hold the
    target-only baselines too, for the speedup attribution).

    Parameters
    ----------
    base, new
        Selections by any run.json field (``{"method": "eagle3", "n": 3}``,
        ``{"drafter.content_hash": "3f2a"}``, ``{"engine.version": "0.32.0"}``; see
        :func:`dsparklab.store.matches_selection`); empty or None:
        :func:`default_comparison` on the runs present.
    datasets, shipped, tiers
        As in :func:`load_runs`; one tier is kept (token ids are compared).
    """
    catalog = open_catalog(runs, shipped=shipped)
    every = token_runs(catalog, datasets=datasets, tiers=tiers, baseline=False)
    methods, _ = by_status(every, read_statuses())
    base, new, tier = _choose_comparison(catalog, methods, base, new)
    sides = [
        load_runs(catalog, datasets=datasets, tiers=tier or tiers, selection=side)
        for side in (base, new)
    ]
    # prompts are paired within a dataset: keep the datasets both sides decoded
    shared = set(sides[0].runs["dataset"]) & set(sides[1].runs["dataset"])
    if not shared:
        raise MissingInputError(
            f"the two run sets share no dataset (base: {sorted(set(sides[0].runs['dataset']))}, "
            f"new: {sorted(set(sides[1].runs['dataset']))}); prompts are compared within one"
        )
    both = [side.only_datasets(shared) for side in sides]
    return Comparison(both[0], both[1], base, new)
