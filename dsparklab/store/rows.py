"""Rows of the aggregate tables (``counters``, ``totals``) with every column present, and
the steps' ``emitted`` tokens every writer derives the same way.

Whoever fills these tables (importers, the vLLM collector) builds its rows here, so a
column added to the schema is added once; NaN rates and lengths are stored as null.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def resumed_tokens(context_lens: Sequence[float | None], accepted_lens: Sequence[int]) -> int:
    """Tokens a request's re-prefills added between its steps, from its steps' context
    lengths :math:`c_k` and ``accepted_len`` :math:`A_k` in step order.

    vLLM preempts a request under KV-cache pressure and, on resume, prefills it again; that
    prefill samples one token no step holds. Between two steps the sequence grows by the
    first one's :math:`A_k + 1` tokens and by any such token:

    .. math:: P = \\sum_k \\max\\big(0,\\ c_{k+1} - c_k - (A_k + 1)\\big)

    over consecutive steps whose context lengths are known (None, NaN or negative: not).
    """
    resumed = 0
    for k in range(len(context_lens) - 1):
        here, after = context_lens[k], context_lens[k + 1]
        if here is None or after is None or not (here >= 0 and after >= 0):  # NaN: False
            continue
        resumed += max(0, int(after) - int(here) - (int(accepted_lens[k]) + 1))
    return resumed


def emitted_tokens(
    accepted_lens: Sequence[int], n_output: int | None, *, resumed: int = 0
) -> list[int | None]:
    """Each step's ``emitted``, from its ``accepted_len`` (in step order) and the
    request's output length :math:`L`: the prefill's token first, then each step's
    :math:`A_k + 1` tokens until the output ends,

    .. math:: e_k = \\min\\Big(A_k + 1,\\ \\max\\big(0,\\ L - 1 - P - \\sum_{j<k} e_j\\big)\\Big)

    where :math:`P` (``resumed``, :func:`resumed_tokens`) is what re-prefills after a
    preemption added, so that :math:`1 + P + \\sum_k e_k = L`. None for every step when
    the output length is not known.
    """
    if n_output is None:
        return [None] * len(accepted_lens)
    left = int(n_output) - 1 - int(resumed)
    out: list[int | None] = []
    for accepted in accepted_lens:
        kept = max(0, min(int(accepted) + 1, left))
        left -= kept
        out.append(kept)
    return out


def counter_row(
    position: int,
    *,
    scope: str = "run",
    request_id: str | None = None,
    interval: int | None = None,
    n_drafted: int | None = None,
    n_reached: int | None = None,
    n_accepted: int | None = None,
    accept_rate: float | None = None,
    survival: float | None = None,
) -> dict[str, Any]:
    """One ``counters`` row (every column present; NaN rates stored as null)."""
    return {
        "scope": scope,
        "request_id": request_id,
        "interval": interval,
        "position": int(position),
        "n_drafted": None if n_drafted is None else int(n_drafted),
        "n_reached": None if n_reached is None else int(n_reached),
        "n_accepted": None if n_accepted is None else int(n_accepted),
        "accept_rate": _finite(accept_rate),
        "survival": _finite(survival),
    }


def totals_row(
    *,
    scope: str = "run",
    request_id: str | None = None,
    interval: int | None = None,
    t_start: float | None = None,
    t_end: float | None = None,
    num_drafts: int | None = None,
    num_draft_tokens: int | None = None,
    num_accepted_tokens: int | None = None,
    num_output_tokens: int | None = None,
    reported_accept_len: float | None = None,
    reported_accept_len_definition: str | None = None,
    reported_accept_rate: float | None = None,
    tpot_s: float | None = None,
    itl_s: float | None = None,
    ttft_s: float | None = None,
) -> dict[str, Any]:
    """One ``totals`` row (every column present)."""
    return {
        "scope": scope,
        "request_id": request_id,
        "interval": interval,
        "t_start": t_start,
        "t_end": t_end,
        "num_drafts": num_drafts,
        "num_draft_tokens": num_draft_tokens,
        "num_accepted_tokens": num_accepted_tokens,
        "num_output_tokens": num_output_tokens,
        "reported_accept_len": _finite(reported_accept_len),
        "reported_accept_len_definition": reported_accept_len_definition,
        "reported_accept_rate": _finite(reported_accept_rate),
        "tpot_s": _finite(tpot_s),
        "itl_s": _finite(itl_s),
        "ttft_s": _finite(ttft_s),
    }


def _finite(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None
