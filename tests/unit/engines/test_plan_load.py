"""Load as a run dimension (issue 32): runs named and ordered by concurrency and repeat,
identities that tell loads apart, the load block run.json records, and the run column a
store's reader gives."""

from __future__ import annotations

import pytest

from dsparklab.engines.plan import (
    CollectOptions,
    default_threads,
    load_block,
    parse_concurrencies,
    plan_runs,
)
from dsparklab.errors import ConfigError
from dsparklab.store.reader import run_columns


def test_runs_interleave_repeats_and_loads_and_name_them():
    specs = plan_runs(
        ["eagle3", "none"], [2], ["humaneval"], engine="vllm", concurrencies=[4, 1], repeats=2
    )
    assert [s.name for s in specs] == [
        "vllm/humaneval/none-c1",
        "vllm/humaneval/eagle3-n2-c1",
        "vllm/humaneval/none-c4",
        "vllm/humaneval/eagle3-n2-c4",
        "vllm/humaneval/none-c1-r1",
        "vllm/humaneval/eagle3-n2-c1-r1",
        "vllm/humaneval/none-c4-r1",
        "vllm/humaneval/eagle3-n2-c4-r1",
    ]
    # no load named: the names runs had before loads existed
    (plain,) = plan_runs(["eagle3"], [2], ["humaneval"], engine="vllm")
    assert plain.name == "vllm/humaneval/eagle3-n2" and plain.concurrency is None


def test_identity_names_the_load_only_when_the_collect_named_one(tmp_path):
    options = CollectOptions(
        methods=["eagle3"], ns=[2], datasets=["humaneval"], out=tmp_path, concurrencies=[2]
    )
    (spec,) = options.runs()
    assert options.identity(spec)["concurrency"] == 2
    plain = CollectOptions(methods=["eagle3"], ns=[2], datasets=["humaneval"], out=tmp_path)
    assert "concurrency" not in plain.identity(plain.runs()[0])


def test_bad_loads_are_one_line():
    with pytest.raises(ConfigError, match="--concurrency '0,2'"):
        parse_concurrencies("0,2")
    with pytest.raises(ConfigError, match="--repeats 0"):
        plan_runs(["none"], [1], ["humaneval"], repeats=0)


def test_the_reference_engine_refuses_a_load_it_cannot_keep(tmp_path):
    from dsparklab.engines.reference.collect import collect

    options = CollectOptions(
        methods=["none"], ns=[1], datasets=["humaneval"], out=tmp_path, concurrencies=[1, 2]
    )
    with pytest.raises(ConfigError, match="one request at a time"):
        collect(options)
    assert not any(tmp_path.iterdir())


def test_the_load_block_and_the_run_column():
    (spec,) = plan_runs(["eagle3"], [2], ["humaneval"], concurrencies=[4], repeats=1)
    block = load_block(spec, 4, [4, 4, 3, float("nan"), 1, 4])
    assert block == {"concurrency": 4, "repeat": 0, "batch_sizes": {"1": 1, "3": 1, "4": 3}}
    assert load_block(spec, 4) == {"concurrency": 4, "repeat": 0}
    meta = {
        "run_id": "r",
        "engine": {"name": "vllm"},
        "method": "eagle3",
        "num_speculative_tokens": 2,
        "target": {},
        "sampling": {},
        "dataset": "humaneval",
    }
    assert run_columns({**meta, "load": block})["concurrency"] == 4
    assert run_columns(meta)["concurrency"] == 0  # not recorded
    assert run_columns({**meta, "engine": {"name": "reference"}})["concurrency"] == 1


def test_a_model_named_another_way_is_the_runs_own_until_its_files_change(tmp_path):
    """Identity by the checkpoint's files: a complete run whose target was named another
    way is skipped while the files hash as the run recorded, and refused once they change
    (each collect hashes its models again)."""
    from dsparklab.provenance import checkpoint_hash
    from tests.conftest import make_run_json, write_run

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "weights.bin").write_bytes(b"first")
    options = CollectOptions(
        methods=["eagle3"], ns=[2], datasets=["humaneval"], out=tmp_path / "store",
        target=str(checkpoint),
    )  # fmt: skip
    (spec,) = options.runs()
    meta = make_run_json(
        run_id=spec.name,
        method="eagle3",
        num_speculative_tokens=2,
        identity={**options.identity(spec), "target": "the-same-model-by-name"},
        target={"name": "ckpt", "path": "elsewhere", "content_hash": checkpoint_hash(checkpoint)},
    )
    write_run(tmp_path / "store", (2, 1, 0), meta=meta)
    assert options.todo() == []  # the same files: the run's own, skipped
    (checkpoint / "weights.bin").write_bytes(b"retrained")
    with pytest.raises(ConfigError, match="identity.target is 'the-same-model-by-name'"):
        options.todo()


@pytest.mark.parametrize(("value", "threads"), [(None, 2), ("1", 1), ("3", 3), ("0", 2), ("x", 2)])
def test_collectors_take_omp_num_threads_else_two(
    monkeypatch: pytest.MonkeyPatch, value: str | None, threads: int
) -> None:
    """A collector's torch threads: OMP_NUM_THREADS where it is a positive count, else 2."""
    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert default_threads() == threads
    options = CollectOptions(methods=["dspark"], ns=[3], datasets=["gsm8k"], out="o")
    assert options.threads == threads
