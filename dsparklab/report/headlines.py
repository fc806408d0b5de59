"""The index's headline findings: at most five sentences with their numbers and intervals.

Each headline is one question a reader asks, answered from frames the findings already
computed (:mod:`dsparklab.report.findings`), never from new counts. Each is a dict:
``title``, ``text`` (the sentences) and ``facts`` (the numbers the text is written from,
as records: what ``report.json`` keeps and tests read):

1. did speculation pay, and where did the time go (speedup at each method's best window;
   the window attribution's largest component);
2. which n (the best window, or that the windows cannot be told apart);
3. where the drafter loses its tokens (the position where survival falls below one half, and
   how acceptance changes with output depth);
4. the seeds' question, answered on these runs;
5. what these runs cannot tell.

A headline whose evidence does not separate says so rather than naming a winner. Numbers
are written ``0.84x (0.79-0.90)``: the value, then its 95 % interval.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

# the components of the window attribution, as a reader names them
COMPONENT_WORDS = {
    "tokens": "tokens per step",
    "draft": "draft cost",
    "verify": "verify cost",
    "other": "the rest of the step",
}


def with_interval(value: float, lo: float, hi: float, unit: str = "") -> str:
    """``0.84x (0.79–0.90)``, ``-0.14 (-0.17 to -0.12)`` when a bound is negative; the
    interval left out where it is unknown."""
    if pd.isna(value):
        return "n/a"
    if pd.isna(lo) or pd.isna(hi):
        return f"{value:.2f}{unit}"
    between = " to " if lo < 0 else "–"
    return f"{value:.2f}{unit} ({lo:.2f}{between}{hi:.2f})"


def _number(value: Any) -> float | None:
    """A float for report.json (None where unknown)."""
    return None if value is None or pd.isna(value) else float(value)


def _best_fact(row: Mapping[str, Any]) -> dict[str, Any]:
    """A best-window row as report.json records it: who, the window, the speedup."""
    load = row.get("concurrency")
    return {
        "run_set": row.get("run_set"),
        "method": row["method"],
        "dataset": row["dataset"],
        "concurrency": None if load is None or pd.isna(load) else int(load),
        "best_n": int(row["best_n"]),
        "speedup": float(row["speedup"]),
        "lo": _number(row["speedup_lo"]),
        "hi": _number(row["speedup_hi"]),
    }


def _who(row: Any) -> str:
    run_set = f"{row['run_set']}: " if row.get("run_set") else ""
    load = row.get("concurrency")
    at = f" at {int(load)} in flight" if load is not None and pd.notna(load) else ""
    return f"{row['method']} on {run_set}{row['dataset']}{at}"


def pay_headline(best: pd.DataFrame, attribution: pd.DataFrame) -> dict[str, Any] | None:
    """Speedup at each (run set, dataset, method)'s best window, and where the speedup
    went between its windows (the attribution's largest component by magnitude)."""
    if best.empty:
        return None
    paid = best[best["speedup_lo"] > 1.0]
    lost = best[best["speedup_hi"] < 1.0]
    parts = [
        f"{_who(r)}: {with_interval(r['speedup'], r['speedup_lo'], r['speedup_hi'], 'x')} "
        f"at n = {int(r['best_n'])}"
        for r in best.to_dict("records")
    ]
    unclear = len(best) - len(paid) - len(lost)
    verdict = (
        f"Speculation paid (the whole interval above 1x) for {len(paid)} of {len(best)}, "
        f"cost time for {len(lost)}"
        + (f", and cannot be told from 1x for {unclear}" if unclear else "")
    )
    text = f"{verdict}: {'; '.join(parts)}."
    facts = [
        {**_best_fact(r), "paid": bool(r["speedup_lo"] > 1.0), "lost": bool(r["speedup_hi"] < 1.0)}
        for r in best.to_dict("records")
    ]
    if not attribution.empty:
        moves = []
        keys = [k for k in ("run_set", "method", "dataset") if k in attribution.columns]
        for _, part in attribution.groupby(keys, sort=True):
            top = part.loc[part["delta_log_speedup"].abs().idxmax()]
            direction = "raised" if top["delta_log_speedup"] > 0 else "lowered"
            has_interval = pd.notna(top["lo"]) and pd.notna(top["hi"])
            separated = has_interval and not (top["lo"] <= 0.0 <= top["hi"])
            facts.append(
                {
                    "run_set": top.get("run_set"),
                    "method": top["method"],
                    "dataset": top["dataset"],
                    "low_n": int(top["low_n"]),
                    "high_n": int(top["high_n"]),
                    "largest_component": str(top["component"]),
                    "delta_log_speedup": float(top["delta_log_speedup"]),
                    "lo": _number(top["lo"]),
                    "hi": _number(top["hi"]),
                    "separated": bool(separated),
                }
            )
            moves.append(
                f"{_who(top)}, n = {int(top['low_n'])} → {int(top['high_n'])}: "
                f"{COMPONENT_WORDS.get(str(top['component']), top['component'])} {direction} "
                f"log speedup most ({with_interval(top['delta_log_speedup'], top['lo'], top['hi'])}"
                + (
                    ")"
                    if separated
                    else "; its interval includes 0)"
                    if has_interval
                    else "; no interval)"
                )
            )
        text += " Where the time went as the window grew: " + "; ".join(moves) + "."
    return {
        "title": "Did speculation pay, and where did the time go?",
        "text": text,
        "facts": facts,
    }


def n_headline(best: pd.DataFrame) -> dict[str, Any] | None:
    """The best window per (run set, dataset, method), or the windows that tie with it;
    where even the best is measurably slower than the target alone, it says so (a
    window is still the one to serve if speculating at all: n = 0 in a schedule is not
    target-only)."""
    if best.empty:
        return None
    parts, facts = [], []
    for r in best.to_dict("records"):
        tied = [int(n) for n in str(r["indistinguishable"]).split()]
        facts.append({**_best_fact(r), "indistinguishable": tied})
        if len(tied) > 1:
            part = (
                f"{_who(r)}: n = {', '.join(map(str, tied))} cannot be told apart "
                f"(best measured n = {int(r['best_n'])})"
            )
        else:
            part = f"{_who(r)}: n = {int(r['best_n'])}"
        if r.get("speedup_hi", float("nan")) < 1.0:
            part += ", though even that is measurably slower than the target alone"
        parts.append(part)
    return {"title": "Which n?", "text": "; ".join(parts) + ".", "facts": facts}


# per bin column: what it is, the first bin's words, the last bin's ({edge}: its lower edge)
BIN_WORDS = {
    "depth_bin": ("output depth", "in the first output tokens", "from output token {edge} on"),
    "context_bin": ("context length", "at the shortest contexts", "from {edge} context tokens on"),
}


def _bin_al(row: pd.Series) -> str:
    """A bin's AL with its interval, or with "one request" where a single request fills the
    bin (the bootstrap over requests has nothing to vary)."""
    if int(row.get("n_requests", 2)) < 2:
        return f"{row['accept_len']:.2f} (one request)"
    return with_interval(row["accept_len"], row["accept_len_lo"], row["accept_len_hi"])


def bin_sentence(lengths: pd.DataFrame, column: str) -> tuple[str, list[dict[str, Any]]]:
    """Per method and dataset at the largest window: AL in the first bin of ``column``
    (``depth_bin`` or ``context_bin``) against the last one, and whether the intervals
    separate (a fall, a rise, or nothing these runs can tell); the sentence and its facts."""
    what, first_words, last_words = BIN_WORDS[column]
    parts, facts = [], []
    for (method, dataset), part in lengths.dropna(subset=[column]).groupby(
        ["method", "dataset"], sort=True
    ):
        top = part[part["n"] == part["n"].max()].sort_values(column)
        if len(top) < 2:
            continue
        first, last = top.iloc[0], top.iloc[-1]
        if last["accept_len_hi"] < first["accept_len_lo"]:
            verdict = "falls"
        elif last["accept_len_lo"] > first["accept_len_hi"]:
            verdict = "rises"
        else:
            verdict = "does not change measurably (the intervals overlap)"
        facts.append(
            {
                "bins": column,
                "method": method,
                "dataset": dataset,
                "n": int(first["n"]),
                "change": verdict.split(" (")[0],
                **{
                    f"{side}_{name}": _number(row[key])
                    for side, row in (("first", first), ("last", last))
                    for name, key in (
                        ("bin", column),
                        ("accept_len", "accept_len"),
                        ("lo", "accept_len_lo"),
                        ("hi", "accept_len_hi"),
                    )
                },
            }
        )
        parts.append(
            f"{method} on {dataset} (n = {int(first['n'])}): AL {verdict} from "
            f"{_bin_al(first)} {first_words} to {_bin_al(last)} "
            f"{last_words.format(edge=int(last[column]))}"
        )
    return (f" With {what}: " + "; ".join(parts) + "." if parts else ""), facts


def loss_headline(
    by_position: pd.DataFrame, binned: Mapping[str, pd.DataFrame] | None = None
) -> dict[str, Any] | None:
    """Per method and dataset (the caller names a dataset with its run set where there
    are several) at its largest window: the first draft position whose survival falls
    below one half, with its interval; and how AL
    changes with output depth and context length (:func:`bin_sentence`; ``binned``: bin
    column -> AL per bin) where the runs tell it."""
    if by_position.empty or "survival" not in by_position:
        return None
    parts, facts = [], []
    for keys, part in by_position.groupby(["method", "dataset"], sort=True):
        top = part[part["n"] == part["n"].max()].sort_values("position")
        below = top[top["survival"] < 0.5]
        method, dataset = keys
        row = top.iloc[-1] if below.empty else below.iloc[0]
        facts.append(
            {
                "method": method,
                "dataset": dataset,
                "n": int(row["n"]),
                # the first position whose survival is below one half (None: none is)
                "position_below_half": None if below.empty else int(row["position"]),
                "survival": float(row["survival"]),
                "lo": _number(row.get("survival_lo", np.nan)),
                "hi": _number(row.get("survival_hi", np.nan)),
            }
        )
        if below.empty:
            last = top.iloc[-1]
            parts.append(
                f"{method} on {dataset} keeps more than half its drafts through position "
                f"{int(last['position'])} of n = {int(last['n'])}"
            )
            continue
        first = below.iloc[0]
        lo, hi = first.get("survival_lo", np.nan), first.get("survival_hi", np.nan)
        parts.append(
            f"{method} on {dataset}: survival falls below one half at position "
            f"{int(first['position'])} (s = {with_interval(first['survival'], lo, hi)}, n = "
            f"{int(first['n'])})"
        )
    text = "; ".join(parts) + ". The explorer lists the draft → target pairs lost there."
    for column, lengths in (binned or {}).items():
        if len(lengths):
            sentence, bin_facts = bin_sentence(lengths, column)
            text += sentence
            facts += bin_facts
    return {"title": "Where does the drafter lose its tokens?", "text": text, "facts": facts}


def seeds_headline(answer: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The seeds' question (DSpark's speedup rising from n = 3 to 7 while Eagle3's does
    not), answered per dataset from the trend test."""
    if not answer:
        return None
    shape = [a["dataset"] for a in answer if a["published_shape"]]
    parts = [
        f"{a['dataset']}: DSpark {a['dspark_trend']} ({a['dspark_change']:+.2f}x), Eagle3 "
        f"{a['eagle3_trend']} ({a['eagle3_change']:+.2f}x)"
        for a in answer
    ]
    verdict = (
        f"the published shape shows on {', '.join(shape)}"
        if shape
        else "the published shape does not show on these runs"
    )
    return {
        "facts": answer,
        "title": "The seeds' question",
        "text": f"Novita reports DSpark's speedup rising from n = 3 to 7 while Eagle3's stays "
        f"flat or falls; here {verdict} (a trend counts only when the intervals separate): "
        + "; ".join(parts)
        + ".",
    }


def limits_headline(notes: list[str]) -> dict[str, Any] | None:
    """What these runs cannot tell, in one sentence (the findings' notes, first ones)."""
    if not notes:
        return None
    shown = "; ".join(note.rstrip(".") for note in notes[:2])
    more = f" ({len(notes) - 2} more below)" if len(notes) > 2 else ""
    return {"title": "What these runs cannot tell", "text": f"{shown}{more}.", "facts": notes}


def headlines(
    *,
    best: pd.DataFrame,
    attribution: pd.DataFrame,
    by_position: pd.DataFrame,
    answer: list[dict[str, Any]],
    notes: list[str],
    binned: Mapping[str, pd.DataFrame] | None = None,
) -> list[dict[str, Any]]:
    """The index's headlines, at most five, in the order a reader asks."""
    made = [
        pay_headline(best, attribution),
        n_headline(best),
        loss_headline(by_position, binned),
        seeds_headline(answer),
        limits_headline(notes),
    ]
    return [h for h in made if h is not None][:5]
