"""The lab on the runs a user brings: sections that say what they cannot compute, typed
--param values, comparisons and tiers chosen from the data."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from IPython.core.interactiveshell import InteractiveShell
from typer.testing import CliRunner

from dsparklab.cli.app import app
from dsparklab.cli.report import parse_params
from dsparklab.errors import MissingInputError
from dsparklab.lab import display
from dsparklab.lab import notebook as nb
from dsparklab.lab.notebook import default_comparison, load_comparison, load_runs, read_records
from dsparklab.lab.sections import SectionLog, run_section
from dsparklab.report.build import discover_notebooks, notebook_parameters
from dsparklab.store import read_run_json
from tests.notebooks.lab_synth import write_synthetic_run

DECLARED = notebook_parameters(discover_notebooks())


def _missing(what: str):
    raise MissingInputError(what)


def test_a_section_without_its_input_says_why_and_its_dependents_follow():
    shown: list[object] = []
    log, space = SectionLog(), {"missing": _missing, "kept": 1}
    assert run_section("One", "x = 2\nx + 1", space, log, show=shown.append) is None
    assert shown == [3] and space["x"] == 2
    line = run_section(
        "Speedup", "kept = 5\nmodel = missing('no baseline')", space, log, show=shown.append
    )
    assert line == "Speedup: not computed: no baseline"
    assert space["kept"] == 1, "a name the skipped section rebound is restored"
    assert "model" not in space
    line = run_section("Costs", "y = model + 1", space, log, show=shown.append)
    assert line == "Costs: not computed: needs `model`, which section 'Speedup' did not compute"
    assert [s["section"] for s in log.not_computed] == ["Speedup", "Costs"]
    with pytest.raises(ZeroDivisionError):  # a real error is not swallowed
        run_section("Broken", "1 / 0", space, log, show=shown.append)
    # the input arrives: the section computes and leaves the list
    assert run_section("Speedup", "model = 7", space, log, show=shown.append) is None
    assert [s["section"] for s in log.not_computed] == ["Costs"]
    # a comprehension's, a lambda's and a def's own names are not the notebook's: a skipped
    # section using `side` in a comprehension leaves no `side` for a later one to need
    line = run_section(
        "Where", "costs = [missing('no baseline') for side in (1, 2)]", space, log,
        show=shown.append,
    )  # fmt: skip
    assert line == "Where: not computed: no baseline"
    body = (
        "counts = [side * 2 for side in (1, 2)]\n"
        "f = lambda side: side\n"
        "def g(side):\n    other = side\n    return other\n"
        "total = sum(counts) + f(1) + g(1)"
    )
    assert run_section("Deltas", body, space, log, show=shown.append) is None
    assert space["total"] == 8 and "side" not in space and "other" not in space
    assert run_section("Reads", "x = costs", space, log, show=shown.append).startswith(
        "Reads: not computed: needs `costs`"
    )


def test_section_magic_in_a_real_kernel_shell_records_what_it_skipped(tmp_path: Path):
    shell = InteractiveShell.instance()
    try:
        nb.setup()
        result = shell.run_cell(
            "%%section Lonely\nfrom dsparklab.errors import MissingInputError\n"
            "raise MissingInputError('nothing to see')"
        )
        assert result.success, "a missing input is not a cell error"
        sections = display._SECTIONS  # the kernel's section log (one notebook per kernel)
        assert sections.not_computed[-1] == {"section": "Lonely", "reason": "nothing to see"}
        assert not shell.run_cell("%%section Bad\nraise ValueError('real')").success
    finally:
        InteractiveShell.clear_instance()


@pytest.mark.parametrize(
    ("item", "value"),
    [
        ("SHIPPED=False", False),
        ("SHIPPED=false", False),
        ("SHIPPED=True", True),
        ("N_BOOT=200", 200),
        ("REFRESH_SECONDS=2", 2),
        ('DATASETS=["humaneval"]', ["humaneval"]),
        ("DATASETS=['humaneval']", ["humaneval"]),
        ("BASE={'method': 'eagle3', 'n': 3}", {"method": "eagle3", "n": 3}),
        ("RUNS=runs/mine", "runs/mine"),
        ("LIVE_RUN=123", "123"),
    ],
)
def test_param_spellings_users_type(item: str, value: object):
    name = item.split("=", 1)[0]
    assert parse_params([item], DECLARED) == {name: value}


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("SHIPPED=no", "SHIPPED takes a bool like its default False"),
        ("SHIPPED=1", "SHIPPED takes a bool"),
        ("N_BOOT=many", "N_BOOT takes a int"),
        ("DATASETS=humaneval", "DATASETS takes a list"),
        ("NO_SUCH=1", "no notebook takes NO_SUCH"),
        ("=1", "expected NAME=VALUE"),
    ],
)
def test_unknown_param_spellings_are_refused_in_one_line(item: str, message: str, tmp_path: Path):
    result = CliRunner().invoke(
        app, ["report", "--runs", str(tmp_path), "--out", str(tmp_path / "r"), "--param", item]
    )
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_comparison_and_tier_come_from_the_runs(tmp_path: Path):
    for method, n in (("dspark", 7), ("eagle3", 3), ("eagle3", 5)):
        write_synthetic_run(tmp_path, method=method, n=n, dataset="prose", tier="tiny")
    write_synthetic_run(tmp_path, method="dspark", n=7, dataset="humaneval", tier="smol")
    pair = load_comparison(tmp_path)
    assert pair.labels == ("eagle3 n=3", "eagle3 n=5"), "one method's windows, Eagle3 first"
    assert set(pair.base.runs["tier"]) == {"tiny"}, "the tier holding the comparison"
    smol = load_runs(tmp_path, single_tier=True)
    assert set(smol.runs["tier"]) == {"smol"}, "single_tier keeps the most realistic tier"
    assert smol.largest_n == 7 and smol.summary()["n"].tolist() == ["7"]
    # two methods at one window, when no method has two
    table = pd.DataFrame({"method": ["dspark", "eagle3"], "n": [7, 7]})
    assert default_comparison(table) == ({"method": "eagle3", "n": 7}, {"method": "dspark", "n": 7})
    with pytest.raises(MissingInputError, match="needs two run sets"):
        default_comparison(smol.runs)
    other = tmp_path / "other"
    write_synthetic_run(other, method="eagle3", n=3, dataset="prose", tier="tiny")
    write_synthetic_run(other, method="eagle3", n=7, dataset="humaneval", tier="tiny")
    with pytest.raises(MissingInputError, match="share no dataset"):
        load_comparison(other)


def _checkpoint(root: Path, content_hash: str) -> None:
    """The runs below ``root`` come from the drafter checkpoint ``content_hash`` (and carry
    run ids of their own)."""
    for meta_path in root.rglob("run.json"):
        meta = json.loads(meta_path.read_text())
        meta["run_id"] = f"{root.name}/{meta['run_id']}"
        if meta.get("drafter"):
            meta["drafter"]["content_hash"] = content_hash
        meta_path.write_text(json.dumps(meta))


def test_two_checkpoints_of_one_drafter_are_compared_by_hash(tmp_path: Path):
    """A drafter update: the same method, n and prompts, two checkpoints told apart by
    their content hash (a prefix is enough), in the API and in `dsparklab compare`."""
    for name, content_hash in (("old", "sha256:0a1b2c3d"), ("new", "sha256:9f8e7d6c")):
        write_synthetic_run(tmp_path / name, method="eagle3", n=3, dataset="prose", seed=len(name))
        write_synthetic_run(tmp_path / name, method="none", n=0, dataset="prose")
        _checkpoint(tmp_path / name, content_hash)
    pair = load_comparison(
        tmp_path, {"drafter.content_hash": "0a1b"}, {"drafter.content_hash": "sha256:9f8e"}
    )
    old = read_run_json(pair.base.runs.loc[pair.base.runs["method"] == "eagle3", "path"].iloc[0])
    assert old["drafter"]["content_hash"] == "sha256:0a1b2c3d"
    assert set(pair.base.positions["run_id"]) == {"old/synthetic-prose-eagle3-n3"}
    assert set(pair.new.positions["run_id"]) == {"new/synthetic-prose-eagle3-n3"}
    assert pair.labels == ("drafter.content_hash=0a1b", "drafter.content_hash=sha256:9f8e")
    with pytest.raises(MissingInputError, match="selection"):
        load_comparison(tmp_path, {"drafter.content_hash": "ffff"}, {"method": "eagle3"})
    result = CliRunner().invoke(
        app,
        ["compare", "--runs", str(tmp_path), "--base", "drafter.content_hash=0a1b",
         "--new", "drafter.content_hash=9f8e", "--out", str(tmp_path / "r"), "--no-png"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    records = read_records(tmp_path / "r" / "notebooks" / "05_regression_diagnosis.ipynb")
    assert records["comparison"] == ["drafter.content_hash=0a1b", "drafter.content_hash=9f8e"]
    assert {r["component"] for r in records["speedup_attribution"]} == {
        "tokens", "draft", "verify", "other"
    }  # fmt: skip
