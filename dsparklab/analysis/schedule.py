"""Which n at which load, as a schedule vLLM serves: ``num_speculative_tokens_per_batch_size``.

vLLM's dynamic speculative decoding takes a list of ``(range_start, range_end, n)``
entries, inclusive batch-size ranges, the first starting at 1; the scheduler looks the
step's number of scheduled requests up in it, carries the last range's n to its largest
batch, and caps every n at the config's ``num_speculative_tokens`` (vLLM 0.34.0,
``vllm/v1/spec_decode/dynamic/utils.py``, ``build_dynamic_sd_schedule_lookup``; 0.32.0's
scheduler, ``vllm/v1/core/sched/scheduler.py``, reads it per step). An n of 0 there
proposes no token at that batch size, but it does not make the server target-only: the
drafter still runs its forward every step to keep its KV cache in step with the target's
(vLLM 0.32.0, ``vllm/v1/spec_decode/llm_base_proposer.py:616-627``; 0.34.0's V2 runner
calls the speculator's ``propose`` whatever n the step schedules,
``vllm/v1/worker/gpu/model_runner.py:2367-2380``). So the lab never schedules 0: the
target-only baseline is not what 0 serves, and a run served with a schedule records its
largest n, so no run measures 0 as a window of its own (vLLM's ``tune_speculative_k``
measures its K = 0 candidate as a served one-range schedule). Where no window pays, the
answer is a target-only server, which the schedule's ``pays`` column says.

The lab measures speedup per window n at each concurrency C (a closed loop of C
requests, whose steps run at batch sizes up to C: run.json's ``load.batch_sizes``) and
turns it into ranges by the rule of :func:`compute_speculation_schedule`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from dsparklab.analysis._frames import as_columns, require_columns
from dsparklab.analysis.projection import compute_best_n
from dsparklab.errors import MissingInputError

SCHEDULE_RULE = (
    "at each measured concurrency: among the measured windows whose speedup interval "
    "reaches the best window's lower bound (the ones the evidence cannot tell from the "
    "best), the smallest n whose upper bound reaches 1 (one that may pay), else the "
    "smallest n, marked as not paying: a target-only server is faster there, and a "
    "schedule cannot turn the drafter off (at n = 0 vLLM still runs the drafter's forward "
    "each step), so 0 is never chosen. Ranges start at each measured concurrency (the "
    "first at 1) and end below the next; the last carries to vLLM's largest batch."
)


def compute_speculation_schedule(
    scaling: pd.DataFrame,
    *,
    by: str | Iterable[str] = (),
    load: str = "concurrency",
) -> pd.DataFrame:
    """The n to serve at each measured load, as batch-size ranges.

    Parameters
    ----------
    scaling
        ``n``, ``speedup``, ``speedup_lo``, ``speedup_hi`` per ``load`` (and ``by``
        group), e.g. :func:`dsparklab.analysis.compute_window_scaling` with
        ``by=("method", "concurrency")``.
    by
        One schedule per group (e.g. ``("method",)``).
    load
        The column holding the requests in flight of each measurement.

    Returns
    -------
    pandas.DataFrame
        One row per group and load, sorted: ``range_start``, ``range_end`` (inclusive;
        ``<NA>`` on the last: vLLM carries it to its largest batch), ``n`` (the choice),
        ``best_n``, ``speedup`` (+ ``_lo``/``_hi``) of the choice, ``best_speedup``,
        ``candidates`` (the windows the evidence cannot tell from the best) and ``pays``
        (the choice's upper bound reaches 1: it may beat target-only there).

    Notes
    -----
    At load :math:`C` with windows :math:`n` measured as :math:`S_n \\in [l_n, h_n]`
    and :math:`b = \\arg\\max_n S_n`, the candidates are
    :math:`\\{n : h_n \\ge l_b\\}` (:func:`~dsparklab.analysis.compute_best_n`'s
    ``indistinguishable``) and the choice is
    :math:`\\min \\{n \\in \\text{candidates} : h_n \\ge 1\\}` (a smaller window verifies
    fewer tokens per request, which grows in cost with the batch), ``pays`` true; where
    that set is empty, :math:`\\min` of the candidates, ``pays`` false: the cheapest
    window the server can run, and a target-only server is faster there.
    Loads :math:`C_1 < C_2 < \\dots` give ranges :math:`[C_i, C_{i+1} - 1]`, the first
    starting at 1.
    """
    by = list(as_columns(by))
    require_columns(
        scaling, [*by, load, "n", "speedup", "speedup_lo", "speedup_hi"], what="schedule"
    )
    measured = scaling.dropna(subset=["speedup"])
    if measured.empty:
        raise MissingInputError(
            "no measured speedup to schedule: the runs need target-only baselines at the "
            "same loads and step timings"
        )
    # the best window per group and load, and the windows it cannot be told from
    keys = [*by, load]
    best = {
        tuple(row[c] for c in keys): row
        for row in compute_best_n(measured, by=keys).to_dict("records")
    }
    # a window's upper bound (its speedup where no interval was drawn)
    top = measured["speedup_hi"].fillna(measured["speedup"])
    rows: list[dict[str, Any]] = []
    for key, group in measured.groupby(by, sort=True) if by else [((), measured)]:
        key = key if isinstance(key, tuple) else (key,)
        loads = sorted(int(c) for c in group[load].unique())
        for index, concurrency in enumerate(loads):
            found = best[(*key, concurrency)]
            candidates = [int(n) for n in str(found["indistinguishable"]).split()]
            at = group[group[load] == concurrency]
            reaches = {int(n) for n in at.loc[top.loc[at.index] >= 1.0, "n"]}
            paying = [n for n in candidates if n in reaches]
            choice = (paying or candidates)[0]
            chosen = at[at["n"] == choice].iloc[0]
            rows.append(
                {
                    **dict(zip(by, key, strict=True)),
                    load: concurrency,
                    "range_start": 1 if index == 0 else concurrency,
                    "range_end": loads[index + 1] - 1 if index + 1 < len(loads) else None,
                    "n": choice,
                    "best_n": int(found["best_n"]),
                    "speedup": float(chosen["speedup"]),
                    "speedup_lo": float(chosen["speedup_lo"]),
                    "speedup_hi": float(chosen["speedup_hi"]),
                    "best_speedup": float(found["speedup"]),
                    "candidates": found["indistinguishable"],
                    "pays": bool(paying),
                }
            )
    schedule = pd.DataFrame(rows)
    schedule["range_end"] = schedule["range_end"].astype("Int64")  # <NA>: carried on
    return schedule


def schedule_config(schedule: pd.DataFrame, *, max_batch: int | None = None) -> dict[str, Any]:
    """vLLM's speculative-config keys serving one schedule of
    :func:`compute_speculation_schedule`: ``num_speculative_tokens`` (the largest n: vLLM
    caps every entry at it) and ``num_speculative_tokens_per_batch_size``, adjacent ranges
    of one n merged; the last range ends at ``max_batch`` (default: its own start, vLLM
    carrying it further)."""
    require_columns(schedule, ["range_start", "range_end", "n", "pays"], what="schedule_config")
    if schedule.empty or not schedule["pays"].any():
        raise MissingInputError(
            "speculation pays at no measured load: serve without a speculative config"
        )
    entries: list[list[int]] = []
    for row in schedule.sort_values("range_start").itertuples():
        end = row.range_end
        if pd.isna(end):
            end = max(int(max_batch or row.range_start), int(row.range_start))
        if entries and entries[-1][2] == int(row.n):
            entries[-1][1] = int(end)
        else:
            entries.append([int(row.range_start), int(end), int(row.n)])
    return {
        "num_speculative_tokens": int(schedule["n"].max()),
        "num_speculative_tokens_per_batch_size": entries,
    }
