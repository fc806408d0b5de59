"""Plotly figure builders: a tidy frame from ``dsparklab.analysis`` in, a figure out.

One ``plot_<view>`` per figure; none computes beyond selecting and reshaping, none calls
``.show()`` or does I/O. Colours come from :mod:`dsparklab.plots.style` and defaults from
:data:`dsparklab.plots.settings`.
"""

from dsparklab.plots.acceptance import (
    plot_acceptance_by_bin,
    plot_acceptance_heatmap,
    plot_prompt_strips,
    plot_request_strip,
    plot_survival_curves,
)
from dsparklab.plots.attribution import plot_speedup_attribution
from dsparklab.plots.calibration import (
    plot_adaptive_whatif,
    plot_calibration_metrics,
    plot_reliability,
)
from dsparklab.plots.live import (
    plot_accept_len_over_time,
    plot_acceptance_over_time,
    plot_coverage,
)
from dsparklab.plots.markov import (
    plot_bias_distribution,
    plot_flip_rates,
    plot_markov_counterfactual,
)
from dsparklab.plots.payoff import (
    plot_position_payoff,
    plot_projected_speedup,
    plot_verify_costs,
    plot_window_prediction,
)
from dsparklab.plots.regression import (
    plot_position_deltas,
    plot_prompt_deltas,
    plot_token_class_deltas,
)
from dsparklab.plots.settings import PlotSettings, settings
from dsparklab.plots.style import (
    METHOD_COLORS,
    TEMPLATE_NAME,
    method_color,
    position_color,
    register_template,
)
from dsparklab.plots.window import (
    plot_draft_costs,
    plot_published_comparison,
    plot_speedup_by_load,
    plot_window_scaling,
)

__all__ = [
    "METHOD_COLORS",
    "TEMPLATE_NAME",
    "PlotSettings",
    "method_color",
    "plot_accept_len_over_time",
    "plot_acceptance_by_bin",
    "plot_acceptance_heatmap",
    "plot_acceptance_over_time",
    "plot_adaptive_whatif",
    "plot_bias_distribution",
    "plot_calibration_metrics",
    "plot_coverage",
    "plot_draft_costs",
    "plot_flip_rates",
    "plot_markov_counterfactual",
    "plot_position_deltas",
    "plot_position_payoff",
    "plot_projected_speedup",
    "plot_prompt_deltas",
    "plot_prompt_strips",
    "plot_published_comparison",
    "plot_reliability",
    "plot_request_strip",
    "plot_speedup_attribution",
    "plot_speedup_by_load",
    "plot_survival_curves",
    "plot_token_class_deltas",
    "plot_verify_costs",
    "plot_window_prediction",
    "plot_window_scaling",
    "position_color",
    "register_template",
    "settings",
]
