"""The notebooks' layer: what they call, where they ship, and the JupyterLab launcher.

- :mod:`dsparklab.lab.notebook`: what every notebook imports (``import
  dsparklab.lab.notebook as nb``), gathered from :mod:`~dsparklab.lab.display` (setup,
  figures, recorded values), :mod:`~dsparklab.lab.runs` (the runs, selected and read),
  :mod:`~dsparklab.lab.published` (published tables, cost profiles) and
  :mod:`~dsparklab.lab.tokens` (token text).
- :mod:`dsparklab.lab.resources`: the notebooks and the published tables shipped with
  the package, found through :mod:`importlib.resources`.
- :mod:`dsparklab.lab.server`: ``dsparklab lab``'s JupyterLab (loopback, token).

Above :mod:`dsparklab.plots` and :mod:`dsparklab.widgets`, below :mod:`dsparklab.report`.
"""
