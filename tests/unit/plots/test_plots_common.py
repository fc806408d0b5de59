"""The layout and reshaping helpers the builders share (dsparklab.plots._common)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dsparklab.errors import ConfigError
from dsparklab.plots._common import (
    cell_grid,
    each_line,
    error_bars,
    interval,
    interval_bars,
    method_window_lines,
    panel_column,
    panel_row,
)
from dsparklab.plots.settings import settings
from dsparklab.plots.style import method_color, method_shade


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "method": ["eagle3", "dspark", "dspark", "dspark"],
            "n": [4, 4, 3, 4],
            "position": [0, 1, 0, 0],
            "rate": [0.5, 0.6, 0.7, 0.8],
        }
    )


def test_each_line_nests_in_the_given_order_and_skips_empty_combinations():
    lines = list(each_line(_frame(), ("method", "n"), sort_by="position"))
    assert [values for values, _ in lines] == [("dspark", 3), ("dspark", 4), ("eagle3", 4)]
    rows = lines[1][1]
    assert rows["position"].tolist() == [0, 1], "rows sorted by sort_by"
    # a column the frame lacks is one None level: every row in one line
    (values, rows), *rest = each_line(_frame(), ("dataset",), sort_by="position")
    assert values == (None,) and len(rows) == 4 and not rest


def test_method_window_lines_shade_by_window_and_name_the_dataset_only_when_several():
    frame = _frame().assign(dataset="humaneval")
    names = [
        name for _, _, name in method_window_lines(frame, sort_by="position", default_method="")
    ]
    assert names == ["dspark · n=3", "dspark · n=4", "eagle3 · n=4"]
    colors = [c for _, c, _ in method_window_lines(frame, sort_by="position", default_method="")]
    assert colors == [method_shade("dspark", 0, 2), method_shade("dspark", 1, 2)] + [
        method_shade("eagle3", 1, 2)
    ]
    assert method_shade("dspark", 1, 2) == method_color("dspark")
    two = pd.concat([frame, frame.assign(dataset="prose")])
    names = [name for _, _, name in method_window_lines(two, sort_by="position", default_method="")]
    assert names[:2] == ["dspark · n=3 · humaneval", "dspark · n=3 · prose"]


def test_panel_layouts_title_their_panels_only_when_asked():
    row = panel_row(["a", "b", "c"], shared_y=True)
    assert [a.text for a in row.layout.annotations] == ["a", "b", "c"]
    assert row.layout.yaxis2.matches == "y", "shared y axes"
    assert not panel_row(["only"], show_titles=False).layout.annotations
    column = panel_column(["r1", "r2"])
    assert [a.text for a in column.layout.annotations] == ["r1", "r2"]
    assert column.layout.yaxis2.domain[1] < column.layout.yaxis.domain[0]


def test_intervals_become_asymmetric_error_bars_or_none():
    frame = pd.DataFrame({"v": [1.0, 2.0], "v_lo": [0.5, 1.0], "v_hi": [2.0, 2.5]})
    bars = interval_bars(frame, "v", thickness=2)
    assert bars == error_bars(frame["v"], frame["v_lo"], frame["v_hi"], thickness=2)
    assert bars is not None
    assert bars["array"] == [1.0, 0.5] and bars["arrayminus"] == [0.5, 1.0]
    assert bars["symmetric"] is False and bars["thickness"] == 2
    assert interval(frame.drop(columns="v_hi"), "v") is None
    assert interval_bars(frame.assign(v_lo=np.nan), "v") is None


def test_cell_grid_lays_out_what_pivot_table_first_gives():
    rng = np.random.default_rng(7)
    frame = pd.DataFrame(
        {
            "n": rng.integers(2, 8, 400),
            "position": rng.integers(0, 9, 400),
            "value": np.where(rng.random(400) < 0.2, np.nan, rng.random(400)),
        }
    )  # repeated cells, missing values, a level (8) the frame lacks, one (2) not listed
    rows, cols = [3, 4, 5, 6, 7, 8], range(9)
    expected = (
        frame.pivot_table(index="n", columns="position", values="value", aggfunc="first")
        .reindex(index=rows, columns=cols)
        .to_numpy(dtype=float)
    )
    got = cell_grid(
        frame, frame["value"], rows="n", row_levels=rows, cols="position", col_levels=cols
    )
    np.testing.assert_array_equal(got, expected)
    assert np.isnan(got[-1]).all()


def test_settings_overridden_for_a_block_and_restored_after_an_error():
    before = settings["figure.template"]
    with settings.overridden({"figure.template": "none"}):
        assert settings["figure.template"] == "none"
    assert settings["figure.template"] == before
    with pytest.raises(RuntimeError), settings.overridden({"figure.height": 300}):
        assert settings["figure.height"] == 300
        raise RuntimeError("a builder failed")
    assert settings["figure.height"] == 420
    with pytest.raises(ConfigError), settings.overridden({"figure.height": -1}):
        pass
    assert settings["figure.height"] == 420
