"""The report builder (papermill, nbconvert, kaleido): notebooks -> offline HTML and an index."""

from dsparklab.report.build import ReportError, build_report, discover_notebooks
from dsparklab.report.html import export_html, remote_resources
from dsparklab.report.results import NotebookResult, ReportResult

__all__ = [
    "NotebookResult",
    "ReportError",
    "ReportResult",
    "build_report",
    "discover_notebooks",
    "export_html",
    "remote_resources",
]
