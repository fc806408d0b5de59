"""What a report build returns: one result per notebook, and where everything went."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dsparklab.report.figures import FigureSet
from dsparklab.store.catalog import Catalog
from dsparklab.store.location import Location


@dataclass
class NotebookResult:
    """One notebook of the report."""

    name: str
    source: Path
    executed: Path
    html: Path | None = None
    seconds: float = 0.0
    error: str | None = None
    figures: list[str] = field(default_factory=list)
    n_plotly_outputs: int = 0
    # sections the runs lacked the inputs for: {"section", "reason"} (not failures)
    not_computed: list[dict[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class ReportResult:
    """Where everything went. ``catalog``: the runs read (below ``runs``, then the shipped
    traces unless they were left out)."""

    out: Path
    runs: Location
    catalog: Catalog
    index: Path
    notebooks: list[NotebookResult]
    figures: FigureSet
    seconds: float

    @property
    def failed(self) -> list[NotebookResult]:
        return [nb for nb in self.notebooks if not nb.ok]
