"""The notebooks' layer: what they call, where they ship, and the JupyterLab launcher.

- :mod:`dsparklab.lab.notebook`: the helpers every notebook imports (``import
  dsparklab.lab.notebook as nb``): setup, figures, recorded values, inputs.
- :mod:`dsparklab.lab.resources`: the notebooks and the published tables shipped with
  the package, found through :mod:`importlib.resources`.
- :mod:`dsparklab.lab.server`: ``dsparklab lab``'s JupyterLab (loopback, token).

Above :mod:`dsparklab.plots` and :mod:`dsparklab.widgets`, below :mod:`dsparklab.report`.
"""
