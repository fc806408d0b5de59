r"""One set of definitions: every acceptance number a tool reports, in the lab's terms.

The formulas, with which tool reports which quantity, are in
``docs/acceptance-definitions.md``; this module is the code those pages describe, and the
importers (:mod:`dsparklab.importers`) check every file's own numbers with it.

Notation. Positions count from 0. A *draft* is one verify step that carried drafted tokens
(vLLM ``num_drafts``, SGLang ``spec_verify_ct``, specdec_bench's decode steps, DeepSpec's
proposals). For :math:`D` drafts of window :math:`n`:

.. math::

    h_j &= \#\{\text{drafts that accepted exactly } j \text{ drafted tokens}\},
        \quad j = 0..n \quad (\text{bonus token excluded}) \\
    A_i &= \sum_{j > i} h_j \quad (\text{drafts whose positions } 0..i
        \text{ were all accepted: the marginal count}) \\
    R_i &= \sum_{j \ge i} h_j \quad (\text{drafts that reached position } i) \\
    s_i &= A_i / D \quad (\text{survival} = \text{marginal} = \text{"joint" rate}) \\
    a_i &= A_i / R_i = s_i / s_{i-1} \quad (\text{conditional rate}, s_{-1} = 1) \\
    \mathrm{AL} &= 1 + \sum_i s_i = 1 + \frac{\sum_j j\, h_j}{D}
        \quad (\text{per-step mean, bonus token included})

The per-request mean :math:`\frac{1}{N}\sum_r \mathrm{AL}_r` weights every request
equally and differs from the per-step mean (which weights requests by their steps) whenever
requests' lengths and acceptance differ. The draft acceptance rate
:math:`\sum_j j\, h_j / \sum_d k_d` divides by drafted tokens, not drafts. A *length*
histogram (specdec_bench) is keyed by tokens emitted per step, :math:`L = j + 1`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from dsparklab.errors import DSparkLabError


# -- rates --------------------------------------------------------------------------------
def marginal_from_conditional(conditional: Sequence[float] | np.ndarray) -> np.ndarray:
    """Survival from conditional rates: :math:`s_i = \\prod_{j \\le i} a_j`.

    A NaN conditional rate (position never reached) makes that and every later survival 0.
    """
    rates = np.asarray(conditional, dtype=np.float64)
    return np.cumprod(np.where(np.isnan(rates), 0.0, rates))


def conditional_from_marginal(marginal: Sequence[float] | np.ndarray) -> np.ndarray:
    """Conditional rates from survival: :math:`a_i = s_i / s_{i-1}` (:math:`s_{-1} = 1`).

    NaN where :math:`s_{i-1} = 0` (the position was never reached).
    """
    survival = np.asarray(marginal, dtype=np.float64)
    previous = np.concatenate([[1.0], survival[:-1]])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(previous > 0, survival / np.where(previous > 0, previous, 1.0), np.nan)


def accept_len_from_marginal(
    marginal: Sequence[float] | np.ndarray, *, bonus: bool = True
) -> float:
    """:math:`\\mathrm{AL} = 1 + \\sum_i s_i` (``bonus=False``: :math:`\\sum_i s_i`)."""
    total = float(np.nansum(np.asarray(marginal, dtype=np.float64)))
    return total + (1.0 if bonus else 0.0)


def fraction_from_percent(value: float) -> float:
    """A percentage (vLLM bench's ``spec_decode_acceptance_rate``) as a fraction."""
    return float(value) / 100.0


def draft_acceptance_rate(accepted_tokens: float, draft_tokens: float) -> float:
    """:math:`\\sum_j j\\,h_j / \\sum_d k_d`: accepted over drafted tokens (NaN if none)."""
    return float(accepted_tokens) / float(draft_tokens) if draft_tokens else math.nan


def pooled_accept_len(num_drafts: float, accepted_tokens: float) -> float:
    """Per-step AL from totals: :math:`1 + \\text{accepted} / D` (NaN without drafts)."""
    return 1.0 + float(accepted_tokens) / float(num_drafts) if num_drafts else math.nan


def completion_per_verify(completion_tokens: float, verify_steps: float) -> float:
    """SGLang's ``spec_accept_length``: completion tokens / verify steps (NaN if none)."""
    return float(completion_tokens) / float(verify_steps) if verify_steps else math.nan


def per_request_accept_len(per_request: Iterable[float]) -> float:
    """The per-request mean AL: :math:`\\frac{1}{N} \\sum_r \\mathrm{AL}_r`."""
    values = [float(v) for v in per_request]
    return sum(values) / len(values) if values else math.nan


# -- histograms ---------------------------------------------------------------------------
def _int_key(key: Any, field: str) -> int:
    if isinstance(key, bool):
        raise DSparkLabError(f"{field}: key {key!r} is not an integer")
    try:
        value = int(key)
    except (TypeError, ValueError):
        raise DSparkLabError(f"{field}: key {key!r} is not an integer") from None
    if str(value) != str(key).strip() and value != key:
        raise DSparkLabError(f"{field}: key {key!r} is not an integer")
    return value


def _count(value: Any, field: str, key: Any) -> float:
    """A histogram entry as a float; DSparkLabError naming ``field`` and the entry's key
    where it is not a number (a bool is not a count)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DSparkLabError(f"{field}: entry {key!r} is {value!r}, not a number")
    return float(value)


def dense_histogram(
    histogram: Sequence[float] | Mapping[Any, float],
    *,
    offset: int = 0,
    size: int | None = None,
    field: str = "histogram",
) -> np.ndarray:
    """A dense accepted-count histogram :math:`h_j` from a list or a sparse mapping.

    Parameters
    ----------
    histogram
        A list indexed by ``j`` (vLLM, SGLang) or a mapping whose keys are ints or strings
        of ints (JSON round trips, specdec_bench).
    offset
        Subtracted from every key: 1 for a *length* histogram (:math:`L = j + 1`).
    size
        Pad to this many entries (``n + 1``); a key beyond it is an error.
    """
    if isinstance(histogram, Mapping):
        items = [(_int_key(k, field) - offset, _count(v, field, k)) for k, v in histogram.items()]
    else:
        items = [(j, _count(v, field, j)) for j, v in enumerate(histogram)]
    if any(j < 0 for j, _ in items):
        low = min(j for j, _ in items) + offset
        raise DSparkLabError(f"{field}: key {low} is below the smallest possible {offset}")
    if any(v < 0 or not math.isfinite(v) for _, v in items):
        raise DSparkLabError(f"{field}: counts must be finite and >= 0")
    top = max((j for j, _ in items), default=-1) + 1
    length = top if size is None else size
    if top > length:
        raise DSparkLabError(
            f"{field}: accepted count {top - 1} exceeds the window n = {length - 1}"
        )
    out = np.zeros(length, dtype=np.float64)
    for j, value in items:
        out[j] += value
    return out


def histogram_from_steps(accepted_per_step: Iterable[int], n: int) -> np.ndarray:
    """:math:`h_j` from per-step accepted counts (vLLM ``per_step_accepted``)."""
    hist = np.zeros(n + 1, dtype=np.int64)
    for accepted in accepted_per_step:
        if not 0 <= int(accepted) <= n:
            raise DSparkLabError(f"accepted count {accepted} is outside [0, n = {n}]")
        hist[int(accepted)] += 1
    return hist


def counts_from_histogram(histogram: Sequence[float] | np.ndarray, n: int) -> pd.DataFrame:
    """Per-position counts from :math:`h_j` (length ``n + 1``).

    Returns ``position``, ``n_reached`` (:math:`R_i = \\sum_{j \\ge i} h_j`) and
    ``n_accepted`` (:math:`A_i = \\sum_{j > i} h_j`) for :math:`i = 0..n-1`.
    """
    hist = np.asarray(histogram, dtype=np.float64)
    if len(hist) != n + 1:
        raise DSparkLabError(f"histogram has {len(hist)} entries; expected n + 1 = {n + 1}")
    tail = np.cumsum(hist[::-1])[::-1]  # tail[i] = sum_{j >= i} h_j
    return pd.DataFrame(
        {
            "position": np.arange(n, dtype=np.int64),
            "n_reached": tail[:n].round().astype(np.int64),
            "n_accepted": tail[1:].round().astype(np.int64),
        }
    )


def per_step_accept_len(histogram: Sequence[float] | np.ndarray) -> float:
    """:math:`1 + \\sum_j j\\,h_j / \\sum_j h_j` (NaN for an empty histogram)."""
    hist = np.asarray(histogram, dtype=np.float64)
    total = hist.sum()
    return 1.0 + float((np.arange(len(hist)) * hist).sum() / total) if total else math.nan


def accepted_tokens(histogram: Sequence[float] | np.ndarray) -> float:
    """:math:`\\sum_j j\\,h_j`."""
    hist = np.asarray(histogram, dtype=np.float64)
    return float((np.arange(len(hist)) * hist).sum())


def counts_from_marginal_rates(
    rates: Sequence[float], num_drafts: int, *, field: str = "rates"
) -> np.ndarray:
    """:math:`A_i = s_i D` recovered as integers from rates a tool computed as ``A_i / D``.

    Raises when a product is not within 1e-6 of an integer (the rates were not of this
    form, or were rounded: then only the rates can be kept).
    """
    values = np.asarray(rates, dtype=np.float64) * float(num_drafts)
    rounded = np.round(values)
    if np.any(np.abs(values - rounded) > 1e-6 * max(1.0, float(num_drafts))):
        worst = int(np.argmax(np.abs(values - rounded)))
        raise DSparkLabError(
            f"{field}[{worst}] x num_drafts = {values[worst]:.6f} is not an integer count"
        )
    return rounded.astype(np.int64)


def specdec_rates_by_length(length_histogram: Mapping[Any, float]) -> dict[str, dict[int, float]]:
    """specdec_bench's ``Conditional_Acceptance_Rate`` and ``Joint_Acceptance_Rate`` maps.

    Keyed by observed length :math:`L` (sorted): conditional
    :math:`P(L' \\ge L \\mid L' \\ge L_{prev})` and joint :math:`P(L' \\ge L)` (the
    survival keyed by length), as its ``AcceptanceRate._process_lengths`` computes them.
    """
    lengths = sorted(
        (_int_key(k, "Acceptance_Length_Histogram"), float(v)) for k, v in length_histogram.items()
    )
    total = sum(v for _, v in lengths)
    conditional: dict[int, float] = {}
    joint: dict[int, float] = {}
    running, previous, product = total, 1.0, 1.0
    for length, count in lengths:
        ratio = running / total if total else math.nan
        conditional[length] = ratio / previous if previous else math.nan
        product *= conditional[length]
        joint[length] = product
        previous = ratio
        running -= count
    return {"conditional": conditional, "joint": joint}


# -- checks -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    """A number a file reports, recomputed by the lab from the file's own counts."""

    quantity: str
    reported: float | None
    computed: float | None
    definition: str
    tolerance: float
    equal: bool
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("reported", "computed"):
            value = out[key]
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = None
        return out


def _score_arrays(score: Any, label: Any) -> tuple[np.ndarray, np.ndarray]:
    score = np.asarray(score, dtype=np.float64)  # [N]
    label = np.asarray(label, dtype=bool)  # [N]
    if score.shape != label.shape or score.ndim != 1:
        raise DSparkLabError(
            f"score and label must be 1-d arrays of one length; got {score.shape} and {label.shape}"
        )
    return score, label


def compute_ece(score: Any, label: Any, *, n_bins: int = 10) -> float:
    """Expected calibration error of a score ``[N]`` (the confidence head's) against
    whether each position was accepted ``[N]``.

    Notes
    -----
    Equal-width bins :math:`b_k = \\min(\\lfloor p_k M \\rfloor, M - 1)`:

    .. math::

        \\mathrm{ECE} = \\frac{1}{N} \\sum_b \\Bigl|\\sum_{k: b_k = b} (y_k - p_k)\\Bigr|

    the same number :func:`dsparklab.analysis.compute_calibration` finishes from counts.
    """
    score, label = _score_arrays(score, label)
    if n_bins < 1:
        raise DSparkLabError(f"n_bins must be >= 1, got {n_bins}")
    if not len(score):
        return math.nan
    bins = np.clip(np.floor(score * n_bins), 0, n_bins - 1).astype(np.int64)
    gap = np.bincount(bins, weights=label - score, minlength=n_bins)
    return float(np.abs(gap).sum() / len(score))


def compute_brier(score: Any, label: Any) -> float:
    """Brier score :math:`\\frac1N \\sum_k (p_k - y_k)^2` of a score ``[N]``."""
    score, label = _score_arrays(score, label)
    return float(np.mean((score - label) ** 2)) if len(score) else math.nan


def compute_auroc(score: Any, label: Any) -> float:
    r"""Area under the ROC curve of a score ``[N]`` ranking the labels ``[N]``.

    Notes
    -----
    The probability that an accepted position scores above a rejected one, ties counting
    1/2: with mid-ranks :math:`r_k` of the scores and :math:`N_+` accepted of :math:`N`,
    :math:`(\sum_{y_k = 1} r_k - N_+ (N_+ + 1) / 2) / (N_+ N_-)`. NaN when one class is
    absent.
    """
    score, label = _score_arrays(score, label)
    n_pos = int(label.sum())
    n_neg = len(label) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    _, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
    mid_rank = np.cumsum(counts) - (counts - 1) / 2  # 1-based rank of each distinct score
    ranks = mid_rank[inverse.reshape(-1)]
    return float((ranks[label].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def check(
    quantity: str,
    reported: float | None,
    computed: float | None,
    *,
    definition: str,
    tolerance: float = 1e-9,
    note: str = "",
) -> Check:
    """Compare ``reported`` with ``computed`` (absolute ``tolerance``, relative for large)."""
    if reported is None or computed is None:
        equal = reported is None and computed is None
    else:
        r, c = float(reported), float(computed)
        if math.isnan(r) and math.isnan(c):
            equal = True
        else:
            equal = abs(r - c) <= tolerance * max(1.0, abs(c))
    return Check(quantity, reported, computed, definition, tolerance, bool(equal), note)
