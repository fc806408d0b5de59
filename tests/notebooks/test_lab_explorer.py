"""The explorer's FigureWidgets, driven from Python (no front end): every control updates
the live figures in place, a heatmap click selects n and position, headless makes no widget.
"""

from __future__ import annotations

import gc
import json
import re
from pathlib import Path

import plotly.graph_objects as go
import pytest
from lab_synth import write_synthetic_runs
from plotly.basewidget import BaseFigureWidget
from plotly.callbacks import Points

from dsparklab import analysis as A
from dsparklab.errors import UnknownMethodError
from dsparklab.lab.notebook import load_runs
from dsparklab.widgets import Explorer, sync_figure
from dsparklab.widgets import figure_widget
from dsparklab.widgets.explorer import FIGURE_CLASSES, LOSSES_SHOWN
from dsparklab.widgets.figure_widget import LabFigureWidget

pytestmark = pytest.mark.notebooks

# what a FigureWidget sends its front end: in place = update messages only
MESSAGES = ("_py2js_addTraces", "_py2js_deleteTraces", "_py2js_update", "_py2js_relayout")


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory):
    root = write_synthetic_runs(
        tmp_path_factory.mktemp("explorer") / "runs", n_requests=2, tokens_per_request=16
    )
    runs = load_runs(root)
    by_position = A.compute_acceptance_by_position(
        runs.positions, steps=runs.steps, by=("method", "n", "dataset"), n_boot=0
    )
    return by_position, A.annotate_positions(runs.positions, steps=runs.steps)


@pytest.fixture
def explorer(frames) -> Explorer:
    return Explorer(*frames)


def _listen(widget: go.FigureWidget) -> list[str]:
    """Names of the messages the widget sends from now on; each must be strict JSON."""
    sent: list[str] = []

    def on_message(change) -> None:
        if change["new"]:
            json.dumps(change["new"], allow_nan=False)  # the widget protocol rejects NaN
            sent.append(change["name"])

    widget.observe(on_message, names=MESSAGES)
    return sent


def test_headless_explorer_makes_no_widget(explorer: Explorer):
    figures = explorer.figures()
    assert sorted(figures) == ["heatmap", "strip", "survival"]
    assert all(type(f) is go.Figure for f in figures.values())
    assert explorer.figure_widgets == {} and explorer._widget is None


def test_figure_widgets_load_plotlys_module_through_the_lab_loader():
    """A LabFigureWidget opens with the small loader as its module and plotly's module as
    data, and holds every message plotly's own module listens for (read from its source)."""
    widget = LabFigureWidget(go.Figure(go.Scatter(x=[0, 1], y=[1, 2])))
    state = widget.get_state()
    plotly_module = str(BaseFigureWidget._esm)
    assert state["_esm"] == (Path(figure_widget.__file__).with_name("figure_widget.js")).read_text()
    assert state["_bundle"] == plotly_module and state["_bundle_key"].startswith("plotly-")
    listened = set(re.findall(r'"change:(_py2js_\w+)"', plotly_module))
    assert listened and listened <= set(state["_held_traits"]), listened


def test_the_figures_are_linked_figure_widgets(explorer: Explorer):
    box = explorer.widget
    assert "dsparklab-explorer" in box._dom_classes
    for name, widget in explorer.figure_widgets.items():
        assert isinstance(widget, LabFigureWidget)
        json.dumps([widget._data, widget._layout], allow_nan=False)  # empty cells: null
        assert FIGURE_CLASSES[name] in widget._dom_classes
        # the widget shows exactly what the static builder draws for the same state
        static = getattr(explorer, name)()
        assert widget.layout.title.text == static.layout.title.text
        assert [t.type for t in widget.data] == [t.type for t in static.data]
    heatmap = explorer.figure_widgets["heatmap"]
    assert "(n = 3 outlined)" in heatmap.layout.title.text
    assert heatmap.data[0].name == "dspark · humaneval"


def test_n_slider_updates_the_widgets_in_place(explorer: Explorer):
    explorer.widget  # noqa: B018  (builds the widgets)
    heatmap = explorer.figure_widgets["heatmap"]
    sent = _listen(heatmap)
    y0 = heatmap.layout.shapes[0].y0
    explorer.n.value = 5
    assert "(n = 5 outlined)" in heatmap.layout.title.text
    assert heatmap.layout.shapes[0].y0 == y0 + 2, "the outline moved two rows (n 3 -> 5)"
    assert explorer.figure_widgets["survival"].layout.title.text.endswith("at n = 5")
    assert "n=5" in explorer.figure_widgets["strip"].layout.title.text
    assert sent == ["_py2js_update"], "one batched update, no trace added or removed"
    assert explorer.updates == {"heatmap": 1, "survival": 1, "strip": 1}
    assert "n = 5" in explorer.status.value


def test_view_method_and_dataset_controls(explorer: Explorer, frames):
    by_position, _ = frames
    explorer.widget  # noqa: B018
    heatmap = explorer.figure_widgets["heatmap"]
    explorer.view.value = "survival"
    want = by_position.query("method == 'dspark' and dataset == 'humaneval' and n == 3")
    assert list(heatmap.data[0].z[0][:3]) == pytest.approx(want["survival"].tolist())
    assert heatmap.layout.coloraxis.colorbar.title.text == "s_i (survival)"
    explorer.method.value = "eagle3"
    explorer.dataset.value = "prose"
    assert heatmap.data[0].name == "eagle3 · prose"
    want = by_position.query("method == 'eagle3' and dataset == 'prose' and n == 3")
    assert list(heatmap.data[0].z[0][:3]) == pytest.approx(want["survival"].tolist())
    assert explorer.request.options == tuple(explorer.requests())
    strip_sent = _listen(explorer.figure_widgets["strip"])
    explorer.request.value = explorer.request.options[-1]
    assert explorer.request.value in explorer.figure_widgets["strip"].layout.title.text
    assert strip_sent == ["_py2js_update"]


def test_heatmap_click_selects_n_and_position(explorer: Explorer):
    explorer.widget  # noqa: B018
    heatmap = explorer.figure_widgets["heatmap"]
    # row "6" (index 3 of n = 3..7), position 2: what plotly.js reports for a click
    points = Points(point_inds=[(3, 2)], xs=[2], ys=["6"], trace_name="", trace_index=0)
    heatmap.data[0]._dispatch_on_click(points, None)
    assert explorer.n.value == 6 and explorer.state.position == 2
    assert "(n = 6 outlined)" in heatmap.layout.title.text
    (outline,) = explorer.figure_widgets["strip"].layout.shapes
    assert (outline.y0, outline.y1) == (1.5, 2.5)
    assert "position 2" in explorer.status.value


def test_sync_figure_replaces_traces_when_they_do_not_line_up():
    widget = go.FigureWidget(go.Figure(go.Scatter(x=[0, 1], y=[1, 2])))
    widget.update_layout(annotations=[dict(text="old")])
    sent = _listen(widget)
    assert not sync_figure(widget, go.Figure([go.Bar(x=[0], y=[1]), go.Bar(x=[1], y=[2])]))
    assert [t.type for t in widget.data] == ["bar", "bar"]
    assert not widget.layout.annotations, "a key the new figure lacks is removed"
    assert "_py2js_addTraces" in sent and "_py2js_deleteTraces" in sent
    assert sync_figure(widget, go.Figure([go.Bar(x=[0], y=[5]), go.Bar(x=[1], y=[6])]))
    assert widget.data[0].y == (5,)


def test_bad_initial_values_are_named(frames):
    with pytest.raises(UnknownMethodError, match="unknown explorer method 'medusa'"):
        Explorer(*frames, method="medusa")
    with pytest.raises(UnknownMethodError, match="view"):
        Explorer(*frames, view="both")  # type: ignore[arg-type]


def test_static_display_saves_the_three_figures(explorer: Explorer, tmp_path: Path):
    explorer.display(interactive=False, out_dir=tmp_path)
    assert sorted(p.stem for p in tmp_path.glob("*.json")) == [
        "explorer_heatmap",
        "explorer_strip",
        "explorer_survival",
    ]
    assert explorer._widget is None


def test_shown_interactively_the_kernel_heap_leaves_the_collector(explorer: Explorer):
    """A full collection over the kernel's heap stalled a redraw by 100-200 ms: once shown,
    the loaded frames and the widgets are frozen out of the collector."""
    try:
        explorer.display(interactive=True)
        tracked = {id(o) for o in gc.get_objects()}
        assert gc.get_freeze_count() > 0
        assert id(explorer.figure_widgets) not in tracked
        assert id(explorer.figure_widgets["heatmap"]._data) not in tracked
        explorer.n.value = explorer.windows()[-1]
        assert explorer.error is None
    finally:
        gc.unfreeze()  # the rest of the session collects as usual


@pytest.fixture
def explorer_distinct_ids(frames) -> Explorer:
    """Request ids that differ between datasets, as in real runs (the synthetic ones repeat)."""
    by_position, annotated = frames
    annotated = annotated.assign(
        request_id=annotated["dataset"].astype(str) + "-" + annotated["request_id"].astype(str)
    )
    return Explorer(by_position, annotated)


def test_a_dataset_change_from_the_front_end_redraws_everything(explorer_distinct_ids):
    """The front end sends the dropdown's new index (``set_state``), as a browser does; the
    request list is replaced by the new dataset's, and status and figures follow."""
    explorer = explorer_distinct_ids
    explorer.widget  # noqa: B018
    assert explorer.request.options == ("humaneval-req000", "humaneval-req001")
    explorer.dataset.set_state({"index": explorer.datasets.index("prose")})
    assert explorer.error is None
    assert explorer.request.options == ("prose-req000", "prose-req001")
    assert explorer.request.value == explorer.state.request == "prose-req000"
    assert explorer.figure_widgets["heatmap"].data[0].name == "dspark · prose"
    assert "prose-req000" in explorer.figure_widgets["strip"].layout.title.text
    assert "prose" in explorer.status.value and "prose-req000" in explorer.status.value
    # then method and n, in that order: each is shown
    explorer.method.set_state({"index": explorer.methods.index("eagle3")})
    explorer.n.set_state({"index": explorer.windows().index(5)})
    assert explorer.figure_widgets["heatmap"].data[0].name == "eagle3 · prose"
    assert "n=5" in explorer.figure_widgets["strip"].layout.title.text
    assert "n = 5" in explorer.status.value and "eagle3" in explorer.status.value


def test_the_n_control_offers_only_windows_that_exist(frames):
    by_position, annotated = frames
    # dspark ran at 3 and 7 only, eagle3 at 4 and 6
    keep = ((by_position["method"] == "dspark") & by_position["n"].isin([3, 7])) | (
        (by_position["method"] == "eagle3") & by_position["n"].isin([4, 6])
    )
    explorer = Explorer(by_position[keep], annotated)
    explorer.widget  # noqa: B018
    assert explorer.n.options == (3, 7)
    explorer.n.value = 7
    explorer.method.value = "eagle3"
    assert explorer.n.options == (4, 6)
    assert explorer.state.n == explorer.n.value == 6, "the nearest window the method has"
    assert "n=6" in explorer.figure_widgets["strip"].layout.title.text


def test_a_handler_error_shows_in_the_status_line(explorer: Explorer, monkeypatch):
    explorer.widget  # noqa: B018

    def broken() -> go.Figure:
        raise ValueError("no such column 'survival'")

    monkeypatch.setattr(explorer, "survival", broken)
    explorer.view.value = "survival"  # the handler raises inside redraw
    assert explorer.error is not None and "no such column" in explorer.error
    assert "no such column" in explorer.status.value
    monkeypatch.undo()
    explorer.view.value = "conditional"
    assert explorer.error is None and "no such column" not in explorer.status.value


def test_a_heatmap_click_lists_the_tokens_the_drafter_loses_there(explorer: Explorer):
    explorer.widget  # noqa: B018
    assert "click a heatmap cell" in explorer.losses_view.value
    points = Points(point_inds=[(0, 1)], xs=[1], ys=["3"], trace_name="", trace_index=0)
    explorer.figure_widgets["heatmap"].data[0]._dispatch_on_click(points, None)
    losses = explorer.losses()
    rows = explorer._run_rows()
    missed = rows[(rows["position"] == 1) & rows["reached"] & ~rows["accepted"]]
    assert len(missed) > 0
    if len(losses) < LOSSES_SHOWN:  # every rejection at the position is in the table
        assert int(losses["count"].sum()) == len(missed)
    assert losses["count"].is_monotonic_decreasing
    view = explorer.losses_view.value
    assert "position 1" in view and "most frequent first" in view
    assert view.count("<tr>") == len(losses) + 1


def test_the_rows_toggle_puts_depth_or_context_on_the_heatmap(tmp_path: Path):
    """With binned acceptance, the heatmap's rows become the output-depth or context bins at
    the slider's n (its cells the binned frame's values); a click then picks a position and
    leaves n alone; back on windows, the heatmap is the windows' again."""
    root = write_synthetic_runs(tmp_path / "runs", n_requests=4, tokens_per_request=200)
    runs = load_runs(root)
    by_position = A.compute_acceptance_by_position(
        runs.acceptance_counts(), by=("method", "n", "dataset"), n_boot=0
    )
    binned = {c: runs.acceptance_by_bin(c, n_boot=0)[0] for c in ("depth_bin", "context_bin")}
    explorer = Explorer(by_position, None, binned=binned)
    explorer.widget  # noqa: B018
    assert explorer.rows.options == ("window n", "output depth", "context length")
    n = explorer.state.n
    explorer.rows.value = "output depth"
    assert explorer.error is None and "rows by output depth" in explorer.status.value
    heat = explorer.figure_widgets["heatmap"]
    assert f"output depth · n = {n}" in heat.layout.title.text
    s = explorer.state
    want = binned["depth_bin"]
    want = want[(want["method"] == s.method) & (want["dataset"] == s.dataset) & (want["n"] == n)]
    bins = sorted(int(v) for v in want["depth_bin"].unique())
    assert list(map(int, heat.data[0].y)) == bins and len(bins) > 1
    top = want[want["depth_bin"] == want["depth_bin"].min()].sort_values("position")
    assert heat.data[0].z[0][: len(top)] == pytest.approx(list(top["accept_rate"]))
    explorer._on_heatmap_click(heat.data[0], Points(point_inds=[0], xs=[1], ys=[64]), None)
    assert explorer.state.position == 1 and explorer.state.n == n == explorer.n.value
    explorer.rows.value = "window n"
    assert list(map(int, explorer.figure_widgets["heatmap"].data[0].y)) == explorer.windows()
