"""The report builder (papermill + nbconvert + kaleido) and the JupyterLab launcher."""

from dsparklab.report.build import (
    NotebookResult,
    ReportError,
    ReportResult,
    build_report,
    discover_notebooks,
)
from dsparklab.report.html import export_html, remote_resources
from dsparklab.report.lab import LabServer, start_lab

__all__ = [
    "LabServer",
    "NotebookResult",
    "ReportError",
    "ReportResult",
    "build_report",
    "discover_notebooks",
    "export_html",
    "remote_resources",
    "start_lab",
]
