"""Engines that produce traces: ``reference`` (CPU, pure torch) and ``vllm`` (plugin taps).

Each engine package exposes a ``collect`` function that ``dsparklab collect --engine NAME``
dispatches to (see :data:`dsparklab.cli.collect.ENGINES`); the run layout they share is
in :mod:`dsparklab.engines.plan`. Nothing is imported here, so loading one engine never
pulls in another's stack.
"""
