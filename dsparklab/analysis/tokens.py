"""Token classes for breakdowns: whitespace, punctuation, identifier, keyword, number, other.

The caller supplies token *strings* (a mapping or a callable token id -> text, e.g. built
from the run's tokenizer with ``tokenizer.decode([i])``), so no tokenizer is loaded here.
"""

from __future__ import annotations

import keyword
import logging
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import pandas as pd

logger = logging.getLogger(__name__)

PAIR = ("draft_token", "target_token")  # a rejection: what was drafted, what the target chose
TOKEN_CLASSES = ("whitespace", "punctuation", "identifier", "keyword", "number", "other")

# Python's keywords and soft keywords, plus the common ones of C, C++, Java, JavaScript,
# TypeScript, Go and Rust (code benchmarks are mostly in these).
KEYWORDS = frozenset(
    [
        *keyword.kwlist,
        *keyword.softkwlist,
        *"""auto bool break case catch char class const constexpr continue default delete do
        double else enum explicit extern final float fn for func function go goto if impl
        import int interface let long loop match mod mut namespace new null nullptr override
        package private protected public pub return self short signed sizeof static struct
        super switch template this throw throws true false try typedef typeof typename
        union unsigned use using var void volatile where while yield async await""".split(),  # noqa: SIM905 (a word list reads better as text)
    ]
)
_NUMBER = re.compile(r"[+-]?(\d[\d_]*(\.\d*)?|\.\d+)([eE][+-]?\d+)?|0[xX][0-9a-fA-F_]+")

TokenText = Mapping[int, str] | Callable[[int], str]


def _is_punctuation(text: str) -> bool:
    return all(unicodedata.category(ch)[0] in "PS" for ch in text)


def classify_token(text: str, *, keywords: Iterable[str] = KEYWORDS) -> str:
    """The class of one token's text (surrounding whitespace ignored unless that is all).

    Order of the tests: whitespace (non-empty, only whitespace: indentation, newlines),
    number, keyword, identifier (``str.isidentifier``, so word pieces count), punctuation
    (only Unicode punctuation or symbol characters), else other.
    """
    if text and not text.strip():
        return "whitespace"
    word = text.strip()
    if not word:
        return "other"
    if _NUMBER.fullmatch(word):
        return "number"
    if word in (keywords if isinstance(keywords, (set, frozenset)) else set(keywords)):
        return "keyword"
    if word.isidentifier():
        return "identifier"
    if _is_punctuation(word):
        return "punctuation"
    return "other"


def token_classes(
    token_ids: np.ndarray, token_text: TokenText, *, keywords: Iterable[str] = KEYWORDS
) -> np.ndarray:
    """The class of each token id ``[N]`` (each distinct id is decoded once)."""
    keywords = frozenset(keywords)
    ids = np.asarray(token_ids, dtype=np.int64)
    unique, inverse = np.unique(ids, return_inverse=True)
    lookup = token_text.get if isinstance(token_text, Mapping) else token_text
    names = []
    missing = 0
    for tid in unique.tolist():
        text = lookup(tid)
        if text is None:
            missing += 1
            names.append("other")
        else:
            names.append(classify_token(text, keywords=keywords))
    if missing:
        logger.warning("%d token ids have no text; counted as 'other'", missing)
    return np.asarray(names, dtype=object)[inverse.reshape(-1)]


def row_tokens(frame: pd.DataFrame, token_column: str) -> np.ndarray:
    """Token id per row ``[N]``: ``token_column``, falling back to ``draft_token`` if null.

    ``target_token`` (the default elsewhere) is what the text actually is at that position;
    engines that cannot see it (vLLM) leave it null, and the drafted token stands in.
    """
    values = frame[token_column].to_numpy(dtype=np.float64, na_value=np.nan)
    if token_column != "draft_token" and "draft_token" in frame.columns:
        values = np.where(np.isnan(values), frame["draft_token"].to_numpy(np.float64), values)
    return np.nan_to_num(values, nan=-1).astype(np.int64)


def rejected_pairs(
    annotated: pd.DataFrame, *, position: int, context: int = 3, top: int = 10
) -> pd.DataFrame:
    r"""Which tokens a drafter loses at one draft position: the rejected draft -> target
    pairs there, most frequent first.

    A row of ``annotated`` (:func:`dsparklab.analysis.annotate_positions`) is a rejection
    when it was reached and not accepted: the step's first mismatch, where the verifier
    emitted its own token (``target_token``, null where the engine cannot see it). With
    :math:`K` rejections at ``position`` and :math:`k_{d,t}` of them drafting :math:`d`
    where the target chose :math:`t`:

    .. math::

        \mathrm{share}_{d,t} = k_{d,t} / K

    Returns
    -------
    pandas.DataFrame
        Up to ``top`` rows, by ``count`` descending (ties: the pair seen first): ``draft_token``,
        ``target_token``, ``count``, ``share``, and ``context``: the drafted tokens before
        ``position`` in the step of the pair's first occurrence (at most ``context`` of
        them; accepted, so also the target's), oldest first.
    """
    columns = ["draft_token", "target_token", "count", "share", "context"]
    keys = [c for c in ("run_id", "request_id", "step") if c in annotated]
    # the columns used, before any row is selected (a wide frame's rows are costly to copy)
    annotated = annotated[[*keys, "position", "reached", "accepted", *PAIR]]
    missed = annotated.loc[
        (annotated["position"] == position) & annotated["reached"] & ~annotated["accepted"]
    ]
    if missed.empty:
        return pd.DataFrame(columns=columns)
    pairs = missed.assign(
        target_token=missed["target_token"].astype("Int64"), row=np.arange(len(missed))
    )
    counted = (
        pairs.groupby(list(PAIR), dropna=False, sort=False)
        .agg(count=("row", "size"), first=("row", "first"))
        .reset_index()
        .sort_values("count", ascending=False, kind="stable")
        .head(top)
    )
    # the context of the shown pairs only: the steps of their first occurrences
    shown = list(missed.iloc[counted["first"].to_numpy()][keys].itertuples(index=False))
    before = annotated.loc[
        (annotated["position"] < position) & (annotated["position"] >= position - context)
    ]
    before = before.loc[pd.MultiIndex.from_frame(before[keys]).isin(shown)]
    prefixes = before.sort_values("position").groupby(keys)["draft_token"].agg(list)
    counted["context"] = [prefixes.get(tuple(key), []) for key in shown]
    counted["share"] = counted["count"] / len(missed)
    return counted[columns].reset_index(drop=True)
