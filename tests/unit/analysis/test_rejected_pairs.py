"""Which tokens a drafter loses at a position (analysis.rejected_pairs)."""

from __future__ import annotations

import pandas as pd

from dsparklab.analysis import annotate_positions, rejected_pairs


def _positions(steps: list[tuple[str, int, list[int], list[int | None], int]]) -> pd.DataFrame:
    """(request, step, drafts, targets, accepted) -> positions rows."""
    rows = []
    for request, step, drafts, targets, accepted in steps:
        for position, (draft, target) in enumerate(zip(drafts, targets, strict=True)):
            rows.append(
                {
                    "request_id": request,
                    "step": step,
                    "position": position,
                    "draft_token": draft,
                    "target_token": target,
                    "accepted": position < accepted,
                }
            )
    return pd.DataFrame(rows)


def test_rejected_pairs_count_the_first_mismatches_most_frequent_first() -> None:
    positions = _positions(
        [
            # position 1 rejected: 7 drafted where the target chose 8, twice; 5 -> 9 once
            ("a", 0, [1, 7, 3], [1, 8, None], 1),
            ("a", 1, [2, 5, 4], [2, 9, None], 1),
            ("b", 0, [6, 7, 3], [6, 8, None], 1),
            # position 1 accepted, or never reached (position 0 rejected): not counted
            ("b", 1, [1, 2, 3], [1, 2, 3], 3),
            ("b", 2, [4, 7, 3], [5, None, None], 0),
        ]
    )
    pairs = rejected_pairs(annotate_positions(positions), position=1)
    assert pairs[["draft_token", "target_token", "count"]].values.tolist() == [[7, 8, 2], [5, 9, 1]]
    assert pairs["share"].tolist() == [2 / 3, 1 / 3]
    assert pairs["context"].tolist() == [[1], [2]]  # the first occurrence's accepted prefix
    assert rejected_pairs(annotate_positions(positions), position=2).empty
    top = rejected_pairs(annotate_positions(positions), position=1, top=1)
    assert len(top) == 1 and top["count"].iloc[0] == 2


def test_rows_whose_index_repeats_keep_each_pair_with_its_own_context() -> None:
    """Frames stacked without a new index (two runs' rows) repeat index labels: each pair's
    context is still the prefix of its own first occurrence."""
    first = annotate_positions(_positions([("a", 0, [1, 7, 3], [1, 8, None], 1)]))
    second = annotate_positions(_positions([("b", 0, [4, 5, 3], [4, 9, None], 1)]))
    stacked = pd.concat([first.assign(run_id="x"), second.assign(run_id="y")])
    assert not stacked.index.is_unique
    pairs = rejected_pairs(stacked, position=1)
    assert pairs[["draft_token", "target_token", "context"]].values.tolist() == [
        [7, 8, [1]],
        [5, 9, [4]],
    ]
