"""The index's headline sentences from known numbers (report.headlines)."""

from __future__ import annotations

import pandas as pd
import pytest

from dsparklab.report.headlines import headlines, n_headline, pay_headline, with_interval


def _best() -> pd.DataFrame:
    return pd.DataFrame(
        [
            # paid: the whole interval above 1x, at a window no other ties with
            dict(run_set="tiny/reference", dataset="humaneval", method="dspark", best_n=3,
                 speedup=1.30, speedup_lo=1.10, speedup_hi=1.50, indistinguishable="3"),
            # cannot be told apart from 1x, and two windows tie
            dict(run_set="tiny/reference", dataset="humaneval", method="eagle3", best_n=7,
                 speedup=1.02, speedup_lo=0.90, speedup_hi=1.15, indistinguishable="3 7"),
        ]
    )  # fmt: skip


def test_intervals_read_as_value_then_range() -> None:
    assert with_interval(0.8412, 0.7899, 0.9001, "x") == "0.84x (0.79–0.90)"
    assert with_interval(1.5, float("nan"), 2.0) == "1.50"


def test_pay_counts_what_paid_and_names_the_largest_component() -> None:
    attribution = pd.DataFrame(
        [
            dict(method="dspark", dataset="humaneval", component=c, delta_log_speedup=v,
                 lo=v - 0.05, hi=v + 0.05, low_n=3, high_n=7)
            for c, v in (("tokens", 0.10), ("draft", -0.01), ("verify", -0.30), ("other", 0.0))
        ]
    )  # fmt: skip
    text = pay_headline(_best(), attribution)["text"]
    assert text.startswith("Speculation paid (the whole interval above 1x) for 1 of 2")
    assert "cannot be told from 1x for 1" in text
    assert "dspark on tiny/reference: humaneval: 1.30x (1.10–1.50) at n = 3" in text
    assert "verify cost lowered log speedup most (-0.30 (-0.35 to -0.25))" in text


def test_where_the_time_went_is_said_per_run_set_and_without_an_interval_says_so() -> None:
    """Two run sets holding the same method and dataset (the demo's live runs beside the
    shipped ones): one sentence each, named; a part with no interval (no bootstrap) claims
    nothing about 0."""
    attribution = pd.DataFrame(
        [
            dict(run_set=run_set, method="dspark", dataset="humaneval", component=c,
                 delta_log_speedup=v, lo=lo, hi=hi, low_n=3, high_n=7)
            for run_set, lo_hi in (("smol", 0.05), ("smol-live", None))
            for c, v in (("tokens", 0.2), ("verify", -0.1))
            for lo, hi in [(v - lo_hi, v + lo_hi) if lo_hi else (float("nan"),) * 2]
        ]
    )  # fmt: skip
    made = pay_headline(_best(), attribution)
    text = made["text"]
    assert "dspark on smol: humaneval, n = 3 → 7:" in text
    assert "dspark on smol-live: humaneval, n = 3 → 7:" in text
    assert text.count("raised log speedup most") == 2
    assert "0.20 (0.15–0.25))" in text and "0.20; no interval)" in text
    assert "its interval includes 0" not in text
    moves = [f for f in made["facts"] if "largest_component" in f]
    assert [f["run_set"] for f in moves] == ["smol", "smol-live"]
    assert [f["separated"] for f in moves] == [True, False]


def test_which_n_does_not_name_a_winner_the_intervals_do_not_separate() -> None:
    text = n_headline(_best())["text"]
    assert "dspark on tiny/reference: humaneval: n = 3" in text
    assert "n = 3, 7 cannot be told apart (best measured n = 7)" in text
    assert "measurably slower" not in text
    # at a load where even the best window is measurably slower, the finding says so
    slower = _best().assign(concurrency=4, speedup=0.75, speedup_lo=0.69, speedup_hi=0.82)
    text = n_headline(slower)["text"]
    assert text.count("even that is measurably slower than the target alone") == 2, text
    assert "eagle3 on tiny/reference: humaneval at 4 in flight: n = 3, 7" in text


def test_at_most_five_in_the_readers_order() -> None:
    by_position = pd.DataFrame(
        dict(method="dspark", dataset="humaneval", n=3, position=[0, 1, 2],
             survival=[0.8, 0.45, 0.2], survival_lo=[0.7, 0.3, 0.1], survival_hi=[0.9, 0.6, 0.3])
    )  # fmt: skip
    made = headlines(
        best=_best(),
        attribution=pd.DataFrame(),
        by_position=by_position,
        answer=[],
        notes=["no baseline for prose", "one window for sql", "no timings for x"],
    )
    assert [h["title"] for h in made] == [
        "Did speculation pay, and where did the time go?",
        "Which n?",
        "Where does the drafter lose its tokens?",
        "What these runs cannot tell",
    ]
    assert (
        "survival falls below one half at position 1 (s = 0.45 (0.30–0.60), n = 3)"
        in (made[2]["text"])
    )
    assert made[3]["text"] == "no baseline for prose; one window for sql (1 more below)."


@pytest.mark.parametrize(
    ("column", "first", "last"),
    [
        ("depth_bin", "in the first output tokens", "from output token 256 on"),
        ("context_bin", "at the shortest contexts", "from 256 context tokens on"),
    ],
)
def test_acceptance_with_depth_or_context_says_whether_the_intervals_separate(
    column: str, first: str, last: str
) -> None:
    from dsparklab.report.headlines import bin_sentence

    def lengths(last_lo: float, last: float, last_hi: float) -> pd.DataFrame:
        return pd.DataFrame(
            dict(method="dspark", dataset="humaneval", n=7, **{column: [0, 16, 256]},
                 accept_len=[2.0, 1.8, last], accept_len_lo=[1.9, 1.6, last_lo],
                 accept_len_hi=[2.1, 2.0, last_hi])
        )  # fmt: skip

    falls, (fact,) = bin_sentence(lengths(1.2, 1.4, 1.6), column)
    assert f"AL falls from 2.00 (1.90–2.10) {first} to 1.40 (1.20–1.60) {last}" in falls
    assert fact == {
        "bins": column, "method": "dspark", "dataset": "humaneval", "n": 7, "change": "falls",
        "first_bin": 0.0, "first_accept_len": 2.0, "first_lo": 1.9, "first_hi": 2.1,
        "last_bin": 256.0, "last_accept_len": 1.4, "last_lo": 1.2, "last_hi": 1.6,
    }  # fmt: skip
    flat, (fact,) = bin_sentence(lengths(1.8, 1.95, 2.1), column)
    assert "does not change measurably" in flat and fact["change"] == "does not change measurably"
    assert bin_sentence(lengths(1.8, 1.95, 2.1).iloc[:1], column) == ("", [])
    lonely = lengths(1.2, 1.4, 1.6).assign(n_requests=[5, 5, 1])
    assert f"to 1.40 (one request) {last}" in bin_sentence(lonely, column)[0]
