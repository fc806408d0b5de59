"""The drafter training loop: batches as a function of the step, resumable state, time
budget, learning-curve milestones."""

from __future__ import annotations

import pytest
import torch

from dsparklab.zoo.training.data import BatchStream, DraftData
from dsparklab.zoo.training.loop import LoopPlan, train_loop


def _data(lengths: list[int], starts: list[int]) -> DraftData:
    ids = [torch.arange(n) for n in lengths]
    return DraftData(ids, [None] * len(ids), [None] * len(ids), (1,), 0, loss_start=starts)


def test_first_pass_in_data_order_then_seeded_permutations():
    stream = BatchStream(_data([5, 6, 7, 8, 9], [1, 1, 2, 2, 3]), per_step=2, seed=0)
    rows = [r for step in range(5) for r in stream.rows(step)]
    assert rows[:5] == [0, 1, 2, 3, 4]
    assert sorted(rows[5:10]) == [0, 1, 2, 3, 4]
    assert rows[5:10] != [0, 1, 2, 3, 4]  # (a fixed seeded permutation)
    # answer tokens: lengths minus prompt lengths = 4, 5, 5, 6, 6
    assert [stream.answer_tokens_seen(k) for k in range(4)] == [0, 9, 20, 26]


class _Toy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)


def _run(plan: LoopPlan, fail_at: int | None = None, marks: list[int] | None = None):
    torch.manual_seed(0)
    model = _Toy()
    stream = BatchStream(_data([3] * 10, [1] * 10), per_step=2, seed=7)
    seen: list[int] = []

    def step_fn(rows: list[int]):
        step = len(seen)
        seen.append(step)
        if fail_at is not None and step == fail_at:
            raise KeyboardInterrupt
        x = torch.randn(len(rows), 4)  # drawn from the per-step seed
        return (
            (model.linear(x) - torch.tensor(rows, dtype=torch.float).unsqueeze(1)) ** 2
        ).mean(), {}

    losses, _, summary = train_loop(
        "toy",
        model,
        plan,
        0.1,
        2,
        stream,
        step_fn,
        lambda m: {},
        False,
        on_milestone=(marks.append if marks is not None else None),
    )
    return model, losses, summary


def test_an_interrupted_run_resumes_to_the_same_weights(tmp_path):
    straight, losses, summary = _run(LoopPlan(steps=12))
    assert summary["steps"] == 12
    assert summary["passes_over_data"] == 2.4
    plan = LoopPlan(steps=12, state_path=tmp_path / "state.pt", checkpoint_s=0.0)
    with pytest.raises(KeyboardInterrupt):
        _run(plan, fail_at=5)
    assert torch.load(tmp_path / "state.pt", weights_only=False)["step"] == 5
    resumed, resumed_losses, _ = _run(plan)
    assert resumed_losses == losses
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def test_time_budget_and_milestones():
    marks: list[int] = []
    _, _, summary = _run(LoopPlan(steps=5, milestones=(4, 10)), marks=marks)
    assert marks == [4, 10]  # 2 answer tokens a row, 2 rows a step
    _, _, timed = _run(LoopPlan(steps=3, time_budget_s=0.2))
    assert timed["train_seconds"] >= 0.2
    assert timed["steps"] > 3
