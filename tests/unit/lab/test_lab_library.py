"""Fast checks of the lab's library parts: colours, settings, builders, records, inputs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import plotly.io as pio
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from dsparklab import analysis as A
from dsparklab import plots as P
from dsparklab.errors import (
    ConfigError,
    DSparkLabError,
    MissingInputError,
    TraceSchemaError,
    UnknownMethodError,
)
from dsparklab.lab.notebook import (
    MIMETYPE,
    RUNS_ENV,
    SHIPPED_ENV,
    cost_table,
    figure_json,
    front_end_attached,
    load_published,
    load_published_verify_costs,
    load_runs,
    load_token_text,
    read_records,
    resolve_runs,
    shipped_traces,
)
from dsparklab.lab.published import DEFAULT_COST_PROFILES
from dsparklab.lab.resources import PUBLISHED_VERIFY_COSTS, cost_profile_file, published_file
from dsparklab.plain_json import plain_json
from dsparklab.plots.style import (
    FALLBACK_COLORS,
    METHOD_COLORS,
    TEMPLATE_NAME,
    method_color,
    position_color,
)
from tests.notebooks.lab_synth import write_synthetic_run


def test_method_colours_are_fixed_and_unknown_ones_hashed():
    assert method_color("dspark") == METHOD_COLORS["dspark"] != method_color("eagle3")
    assert method_color("DSpark") == METHOD_COLORS["dspark"]
    colours = {name: method_color(name) for name in ("medusa", "hydra", "lookahead", "mtp")}
    assert all(c in FALLBACK_COLORS for c in colours.values())
    # the same whatever else is plotted, and across processes (sha256, not hash())
    assert (
        method_color("medusa")
        == colours["medusa"]
        == FALLBACK_COLORS[
            int.from_bytes(__import__("hashlib").sha256(b"medusa").digest()[:4], "big")
            % len(FALLBACK_COLORS)
        ]
    )


def test_position_colours_are_sequential_and_distinct():
    colours = [position_color(i, 7) for i in range(7)]
    assert len(set(colours)) == 7
    assert position_color(0, 1) == position_color(0, 7)
    assert TEMPLATE_NAME in pio.templates


def test_settings_validate_keys_and_values():
    assert P.settings["figure.height"] == 420
    with pytest.raises(UnknownMethodError, match="figure.height"):
        P.settings["figure.hieght"] = 3
    with pytest.raises(ConfigError):
        P.settings["figure.height"] = -1
    P.settings["figure.height"] = 500
    try:
        fig = P.plot_survival_curves(pd.DataFrame({"position": [0], "survival": [0.5]}))
        assert fig.layout.height == 500
    finally:
        P.settings.reset()
    assert P.settings["figure.height"] == 420


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, pd.DataFrame]:
    root = tmp_path_factory.mktemp("small")
    for method in ("dspark", "eagle3"):
        write_synthetic_run(
            root, method=method, n=4, dataset="humaneval", n_requests=2, tokens_per_request=16
        )
    write_synthetic_run(
        root, method="none", n=0, dataset="humaneval", n_requests=2, tokens_per_request=16
    )
    runs = load_runs(root)
    return runs.positions, runs.steps


def test_builders_draw_the_analysis_numbers(small):
    positions, steps = small
    by_position = A.compute_acceptance_by_position(
        positions, steps=steps, by=("method", "n", "dataset"), n_boot=0
    )
    fig = P.plot_acceptance_heatmap(by_position, value="survival", highlight_n=4)
    z = np.array(fig.data[0].z, dtype=float)  # [n, position] of the first panel (dspark)
    want = by_position.query("method == 'dspark'").sort_values("position")["survival"]
    np.testing.assert_allclose(z[0], want.to_numpy())
    outlines = [shape for shape in fig.layout.shapes if shape.line.width == 3]
    assert len(outlines) == 2, "the n row outlined in both panels"
    assert fig.layout.shapes[0].line.width == 3, "the outline comes first"
    assert [t.name for t in fig.data] == ["dspark · humaneval", "eagle3 · humaneval"]
    # each cell's evidence: its counts and interval in the hover; thin cells veiled
    panel = by_position.query("method == 'dspark'").sort_values(["n", "position"])
    first = panel.iloc[0]
    hover = fig.data[0].customdata[0][int(first["position"])]
    assert f"reached {int(first['n_reached'])} · accepted {int(first['n_accepted'])}" in hover
    assert "interval" not in hover, "no interval without bootstrap replicates"
    booted = A.compute_acceptance_by_position(
        positions, steps=steps, by=("method", "n", "dataset"), n_boot=20
    )
    cell = booted.query("method == 'dspark'").sort_values(["n", "position"]).iloc[0]
    hover = P.plot_acceptance_heatmap(booted, value="survival").data[0].customdata[0][0]
    assert f"95 % interval {cell['survival_lo']:.2f}–{cell['survival_hi']:.2f}" in hover
    veils = [shape for shape in fig.layout.shapes if shape.fillcolor]
    thin = (by_position["n_reached"] < 10) & by_position["survival"].notna()
    assert len(veils) == int(thin.sum())
    assert fig.layout.coloraxis.colorbar.title.text == "s_i (survival)"
    strict = P.plot_acceptance_heatmap(by_position, value="survival", min_reached=0)
    assert not [shape for shape in strict.layout.shapes if shape.fillcolor]
    with pytest.raises(UnknownMethodError, match="accept_rate, survival"):
        P.plot_acceptance_heatmap(by_position, value="survivl")
    with pytest.raises(TraceSchemaError, match="'n'"):
        P.plot_acceptance_heatmap(by_position.drop(columns="n"))
    empty = P.plot_acceptance_heatmap(by_position, methods=["medusa"])
    assert "no drafted positions" in empty.layout.annotations[0].text


# column names an axis title must not show, alone or inside a longer title ("Δ accept_len")
BARE_COLUMNS = re.compile(r"\b(accept_rate|accept_len|tokens_per_step|draft_time_s)\b")


def test_every_builder_returns_a_serialisable_figure(small):
    positions, steps = small
    by_position = A.compute_acceptance_by_position(
        positions, steps=steps, by=("method", "n", "dataset"), n_boot=20
    )
    annotated = A.annotate_positions(positions, steps=steps)
    model = A.compute_speedup_model(steps, by=("method", "dataset"), n_boot=0)
    attribution = A.compute_markov_attribution(positions, steps=steps, by=("method", "n"))
    half = positions.query("method == 'eagle3'")
    diff = A.compute_regression_diff(half, half, level="position", n_boot=0)
    figures = [
        P.plot_survival_curves(by_position),
        P.plot_request_strip(annotated, max_requests=1),
        P.plot_window_scaling(model),
        P.plot_draft_costs(model),
        P.plot_published_comparison(model, load_published()),
        P.plot_reliability(A.compute_reliability(positions, steps=steps, by="method")),
        P.plot_calibration_metrics(A.compute_calibration(positions, steps=steps, by="method")),
        P.plot_adaptive_whatif(A.compute_adaptive_verification(positions, by=("method", "n"))),
        P.plot_flip_rates(attribution),
        P.plot_markov_counterfactual(attribution),
        P.plot_bias_distribution(
            A.compute_markov_bias_distribution(positions, by="method"), facet="method"
        ),
        P.plot_position_deltas(diff),
    ]
    for fig in figures:
        plain = figure_json(fig)
        json.dumps(plain, allow_nan=False)  # what the Jupyter protocol accepts
        assert plain["data"], fig.layout.title.text
        assert fig.layout.meta["dsparklab_figure"]
        # axes are labelled for a reader, never with a bare column name
        axis_titles = {
            (axis.get("title") or {}).get("text")
            for key, axis in plain["layout"].items()
            if key.startswith(("xaxis", "yaxis"))
        }
        bare = [t for t in axis_titles if t and BARE_COLUMNS.search(t)]
        assert not bare, (fig.layout.title.text, bare)
    # a run compared with itself: every delta is zero
    assert np.allclose(diff["delta"].dropna(), 0.0)


def test_strip_marks_accepted_rejected_not_reached(small):
    positions, steps = small
    annotated = A.annotate_positions(positions, steps=steps)
    run = annotated["run_id"].iloc[0]
    first = annotated.query("run_id == @run and request_id == 'req000'")
    fig = P.plot_request_strip(annotated, request_ids="req000", run_id=run)
    z = np.array(fig.data[0].z, dtype=float)  # [position, step]
    mine = steps.loc[(steps["run_id"] == run) & (steps["request_id"] == "req000")]
    accepted_len = mine.set_index("step")["accepted_len"]
    for j, step in enumerate(sorted(first["step"].unique())):
        accepted = int(accepted_len[step])
        column = z[:, j]
        assert (column[:accepted] == 2).all()
        if accepted < len(column):
            assert column[accepted] == 1
            assert (column[accepted + 1 :] == 0).all()
    # padded to more position rows (the explorer's one height for every window): the rows
    # past the drafts are empty, and the figure as tall as a strip of that many drafts
    n = z.shape[0]
    padded = P.plot_request_strip(annotated, request_ids="req000", run_id=run, positions=n + 3)
    wide = np.array(padded.data[0].z, dtype=float)
    assert wide.shape == (n + 3, z.shape[1]) and np.isnan(wide[n:]).all()
    np.testing.assert_array_equal(wide[:n], z)
    assert padded.data[0].hoverongaps is False
    assert padded.layout.height > fig.layout.height


def test_plain_values_and_read_records(tmp_path: Path):
    frame = pd.DataFrame({"a": [1, 2], "b": [0.5, np.nan]})
    assert plain_json(frame) == [{"a": 1, "b": 0.5}, {"a": 2, "b": None}]
    assert plain_json({"x": np.float32(1.5), "y": [np.int64(3)]}) == {"x": 1.5, "y": [3]}
    with pytest.raises(DSparkLabError, match="JSON-like"):
        plain_json(object())
    marker = object()  # the widget protocol passes what it does not know through
    assert plain_json({"k": (np.inf, np.arange(2), marker)}, strict=False) == {
        "k": [None, [0, 1], marker]
    }
    nb = new_notebook(cells=[new_code_cell("x")])
    nb.cells[0].outputs = [
        new_output("display_data", data={MIMETYPE: {"name": "a", "value": 1}}),
        new_output("display_data", data={"text/plain": "ignored"}),
        new_output("display_data", data={MIMETYPE: {"name": "a", "value": [2, None]}}),
    ]
    path = tmp_path / "n.ipynb"
    nbformat.write(nb, path)
    assert read_records(path) == {"a": [2, None]}
    with pytest.raises(DSparkLabError, match="no such notebook"):
        read_records(tmp_path / "missing.ipynb")


def test_resolve_runs_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setenv(RUNS_ENV, str(tmp_path / "b"))
    assert str(resolve_runs(tmp_path / "a")) == str((tmp_path / "a").resolve())
    assert str(resolve_runs("")) == str((tmp_path / "b").resolve())
    monkeypatch.delenv(RUNS_ENV)
    with pytest.raises(TraceSchemaError, match="make demo"):
        resolve_runs(tmp_path / "nope")
    # The default and relative paths are the working directory's, not the checkout's.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TraceSchemaError, match="no runs at runs/demo"):
        resolve_runs("")
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    assert str(resolve_runs("")) == str((tmp_path / "runs" / "demo").resolve())
    assert str(resolve_runs("a")) == str((tmp_path / "a").resolve())
    assert front_end_attached() is False, "not inside a kernel"


def test_shipped_traces_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """$DSPARKLAB_SHIPPED names them (empty: none); else data/traces in the working dir."""
    monkeypatch.delenv(SHIPPED_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert shipped_traces() is None
    (tmp_path / "data" / "traces").mkdir(parents=True)
    assert shipped_traces() == (tmp_path / "data" / "traces").resolve()
    monkeypatch.setenv(SHIPPED_ENV, "")
    assert shipped_traces() is None
    monkeypatch.setenv(SHIPPED_ENV, str(tmp_path / "elsewhere"))
    with pytest.raises(TraceSchemaError, match="no shipped traces at"):
        shipped_traces()


def test_load_runs_errors_and_token_text(tmp_path: Path):
    run = write_synthetic_run(
        tmp_path, method="dspark", n=3, dataset="prose", n_requests=1, tokens_per_request=8
    )
    with pytest.raises(MissingInputError, match="no runs under"):
        load_runs(tmp_path, methods=["eagle3"])
    runs = load_runs(tmp_path)
    assert load_token_text(runs) is str, "no tokenizer.json at the synthetic target path"
    assert runs.runs["path"].tolist() == [str(run)]


def test_shipped_runs_join_labelled_by_tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """shipped=True adds the shipped traces; two tiers -> dataset labels '<tier>/<dataset>'."""
    demo, shipped = tmp_path / "demo", tmp_path / "traces"
    for method, n in (("dspark", 3), ("none", 0)):
        write_synthetic_run(demo, method=method, n=n, dataset="humaneval", tier="tiny")
        write_synthetic_run(shipped / "smol", method=method, n=n, dataset="humaneval", tier="smol")
    write_synthetic_run(shipped / "smol", method="dspark", n=3, dataset="instruct", tier="smol")
    monkeypatch.setenv(SHIPPED_ENV, str(shipped))

    alone = load_runs(demo, shipped=False)
    assert set(alone.positions["dataset"]) == {"humaneval"}
    both = load_runs(demo, shipped=True)
    assert set(both.positions["dataset"]) == {"tiny/humaneval", "smol/humaneval", "smol/instruct"}
    assert set(both.steps["dataset"]) == set(both.positions["dataset"])
    assert (both.positions["raw_dataset"] == both.positions["dataset"].str.split("/").str[1]).all()
    assert both.dataset_labels(["humaneval"]) == ["smol/humaneval", "tiny/humaneval"]
    # Baselines stay matched to their own tier: one none run per tier in steps.
    base = both.steps[both.steps["method"] == "none"]
    assert set(base["dataset"]) == {"tiny/humaneval", "smol/humaneval"}
    one = load_runs(demo, shipped=True, tiers=["smol"])
    assert set(one.positions["dataset"]) == {"humaneval", "instruct"}, "one tier: plain names"
    with pytest.raises(MissingInputError, match="tiers=\\['large'\\]"):
        load_runs(demo, shipped=True, tiers=["large"])


def test_published_verify_costs_are_labelled_and_drawn_beside_the_profile(tmp_path: Path):
    table = load_published_verify_costs()
    assert (table["label"] == "published").all() and table["how_obtained"].notna().all()
    assert "same" not in set(table["source"])  # each row names its source
    glm = table[table["setup"].str.startswith("GLM-5.2")].set_index("verify_tokens")
    assert glm.loc[8, "cost_vs_decode"] == 1.47 and glm.loc[8, "hardware"] == "8x H200"
    assert table["verify_tokens"].isna().sum() == 1  # Cohere's: k not stated
    costs = A.cost_table_from_profile(
        json.loads(cost_profile_file("assumed-gpu-like").read_text()),
        methods=["dspark"],
        ns=range(1, 8),
    )
    fig = P.plot_verify_costs(costs, table)
    names = [trace.name for trace in fig.data]
    assert names[0] == "assumed-gpu-like (profile)"
    published = names[1:]
    assert published and all(name.endswith("(published)") for name in published)
    assert len(published) == table.dropna(subset=["verify_tokens"])["setup"].nunique()
    assert list(fig.data[0].x) == list(range(2, 9))  # w = n + 1
    # a published setup is a profile of its own, by name, each number sourced
    setup = "GLM-5.2 (native MTP / DSpark chain)"
    write_synthetic_run(tmp_path / "runs", method="dspark", n=7, dataset="humaneval", n_requests=1)
    runs = load_runs(tmp_path / "runs")
    published = cost_table(f"published:{setup}", runs)
    glm8 = published[(published["n"] == 7) & (published["method"] == "dspark")].iloc[0]
    assert glm8["verify_cost"] == 1.47 and glm8["profile"] == f"published: {setup}"
    assert "stated (bucket-8" in glm8["cost_source"] and "pegainfer" in glm8["cost_source"]
    # its drafter (an MTP / DSpark chain) is no lab method: no method is charged its pass
    assert published["draft_cost"].isna().all()
    fig = P.plot_verify_costs(published, table)
    assert "pegainfer" in str(fig.data[0].customdata[-1][0])
    both = cost_table(DEFAULT_COST_PROFILES, runs)  # a list: one table under the other
    deepseek = both[both["profile"].str.startswith("published: DeepSeek")]
    assert (deepseek["draft_cost"] == 0.18).all()  # DSpark block 7: one pass per block
    assumed = both[both["profile"] == "assumed-gpu-like"]
    assert assumed["cost_source"].str.contains("assumption, not a measurement").all()
    with pytest.raises(MissingInputError, match="has no 1"):
        cost_table("published:Qwen3-14B + DSpark block 7", runs)
    bad = tmp_path / "costs.csv"
    bad.write_text(published_file(PUBLISHED_VERIFY_COSTS).read_text().replace(",1.47,", ",lots,"))
    with pytest.raises(TraceSchemaError, match="line 10: cost_vs_decode must be a positive"):
        load_published_verify_costs(bad)


def test_published_table():
    table = load_published()
    assert set(table["method"]) == {"dspark", "eagle3"}
    assert (table["label"] == "published").all()
    k26 = table.query("target == 'Kimi-K2.6' and benchmark == 'mean6' and drafter == 'DSpark'")
    assert k26.set_index("n")["speedup"].to_dict() == {3: 2.17, 7: 2.55}


def test_token_labels_show_whitespace_and_escape_markup(small):
    from dsparklab.plots.acceptance import visible_token

    assert visible_token(" def\n") == "·def↵"
    assert visible_token("<br>") == "&lt;br&gt;"
    positions, steps = small
    annotated = A.annotate_positions(positions, steps=steps)
    fig = P.plot_request_strip(
        annotated, max_requests=1, methods=["dspark"], token_labels=lambda t: f" t{t}"
    )
    labels = {label for row in fig.data[0].text for label in row if label}
    assert labels
    assert all(label.startswith("·t") for label in labels)
