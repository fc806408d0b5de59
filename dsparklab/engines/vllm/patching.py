"""Patching vLLM: the compatibility check, install and uninstall, over the patch table.

The points, their wrappers and the vLLM lines where each exists by design are the patch
table (:mod:`~dsparklab.engines.vllm.patch_table`). Before patching, the installed vLLM's
line is read from its version and every point of that line is looked up: a point absent by
design in the line is not looked for; a point absent unexpectedly disables only the
patches that need it, with one warning naming it and what is then not recorded. Patching
twice is a no-op; :func:`uninstall` restores every attribute.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

from dsparklab.engines.vllm import runs
from dsparklab.engines.vllm.config import TapConfig, TapConfigError
from dsparklab.engines.vllm.patch_table import (
    CLASS_POINTS,
    LINES,
    PatchPoint,
    patches_of,
    vllm_line,
)
from dsparklab.engines.vllm.staging import MARK, unwrap
from dsparklab.errors import DSparkLabError

logger = logging.getLogger(__name__)

# the patch table's lines, 0.32 to 0.34 (pyproject's [vllm] extra says the same; a test)
SUPPORTED_VLLM = ">=0.32,<0.35"


class UnsupportedVLLMError(DSparkLabError, RuntimeError):
    """The installed vLLM lacks something the taps patch (named in the message)."""


@dataclass
class PatchState:
    registered: bool = False
    originals: dict[tuple[type, str], Any] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # point name -> why
    line: str | None = None  # the patch table's vLLM line in use
    lock: threading.Lock = field(default_factory=threading.Lock)


STATE = PatchState()
_MISSING_ATTR = object()


def vllm_version() -> str:
    try:
        import vllm
    except ImportError as err:
        raise UnsupportedVLLMError(
            f"vllm is not importable ({err}); install vllm{SUPPORTED_VLLM} (pip install "
            "'dsparklab[vllm]') or unset DSPARKLAB_TRACE_DIR"
        ) from err
    return str(getattr(vllm, "__version__", "unknown"))


def probe(point: PatchPoint) -> type:
    """The class of ``point`` in the installed vLLM; raises naming what is missing."""
    try:
        module = import_module(point.module)
    except ImportError as err:
        raise UnsupportedVLLMError(f"module {point.module} is missing ({err})") from err
    cls = getattr(module, point.cls, None)
    if not isinstance(cls, type):
        raise UnsupportedVLLMError(f"{point.module}.{point.cls} is missing")
    if point.method is None:
        return cls
    fn = getattr(cls, point.method, None)
    if not callable(fn):
        raise UnsupportedVLLMError(f"{point.name} is missing")
    names = set(inspect.signature(unwrap(fn)).parameters)
    for name in point.params:
        if name not in names:
            raise UnsupportedVLLMError(f"{point.name} has no parameter {name!r}")
    return cls


def installed_line() -> tuple[str, str]:
    """(vLLM version, its patch-table line); raises for a vLLM older than the table."""
    version = vllm_version()
    line = vllm_line(version)
    if line is None:
        raise UnsupportedVLLMError(
            f"vLLM {version} is not supported (the dsparklab taps support vllm{SUPPORTED_VLLM})"
        )
    return version, line


def _points(line: str) -> list[PatchPoint]:
    points = [p.point for p in patches_of(line)]
    return list(dict.fromkeys([*points, *(point for point, _ in CLASS_POINTS)]))


def check_vllm_compat() -> dict[str, type]:
    """Look up every patch point of the installed vLLM's line; raise
    :class:`UnsupportedVLLMError` on the first missing. Returns ``{"module:Class": class}``."""
    version, line = installed_line()
    found: dict[str, type] = {}
    for point in _points(line):
        try:
            found[f"{point.module}:{point.cls}"] = probe(point)
        except UnsupportedVLLMError as err:
            raise UnsupportedVLLMError(
                f"vLLM {version} (line {line}): {err}; the dsparklab taps support "
                f"vllm{SUPPORTED_VLLM}"
            ) from err
    return found


def register_from_env() -> None:
    """The entry point's work once ``DSPARKLAB_TRACE_DIR`` is set (idempotent)."""
    with STATE.lock:
        if STATE.registered:
            return
        STATE.registered = True
        try:
            config = TapConfig.from_env()
        except TapConfigError as err:
            logger.error("dsparklab: %s; tracing stays off", err)
            return
    if config is None:
        return
    try:
        install(config)
    except UnsupportedVLLMError as err:
        logger.error("dsparklab: %s; tracing stays off", err)


def configure(config: TapConfig) -> bool:
    """Use ``config`` for tap runs made from now on in this process; install if needed.

    Returns whether any tap is installed (False on an unusable vLLM, logged).
    """
    with STATE.lock:
        STATE.registered = True
    try:
        install(config)
    except UnsupportedVLLMError as err:
        logger.error("dsparklab: %s; tracing stays off", err)
        return False
    return is_installed()


def is_installed() -> bool:
    return bool(STATE.originals)


def install(config: TapConfig) -> list[str]:
    """Patch vLLM's classes (idempotent); returns the names of points missing unexpectedly.

    The points of the installed vLLM's line are looked up; each one missing is warned
    about once, naming it and what is then not recorded, and the other patches go in.
    Raises :class:`UnsupportedVLLMError` for a vLLM older than the table or when nothing
    can be patched.
    """
    runs.STATE.config = config
    runs.watch_trace_dir(config.trace_dir)
    if STATE.originals:
        return sorted(STATE.missing)
    version, line = installed_line()
    STATE.line = line
    if not version.startswith(f"{line}."):
        logger.warning(
            "dsparklab: vLLM %s is newer than the patch table's lines (%s); its %s table is used",
            version,
            ", ".join(LINES),
            line,
        )
    patches = patches_of(line)
    classes: dict[PatchPoint, type] = {}
    for point in _points(line):
        try:
            classes[point] = probe(point)
        except UnsupportedVLLMError as err:
            STATE.missing[point.name] = str(err)
    lost: dict[str, list[str]] = {name: [] for name in STATE.missing}
    for patch in patches:
        absent = [p.name for p in (patch.point, *patch.needs) if p not in classes]
        if absent:
            for name in absent:
                if patch.records not in lost[name]:
                    lost[name].append(patch.records)
            continue
        assert patch.point.method is not None
        _patch(classes[patch.point], patch.point.method, patch.make)
    for point, records in CLASS_POINTS:
        if point in classes:
            # collective_rpc("dsparklab_flush") / ("dsparklab_close") from LLM.collective_rpc
            _set_attr(classes[point], "dsparklab_flush", runs.flush_worker)
            _set_attr(classes[point], "dsparklab_close", runs.close_worker)
        else:
            lost[point.name].append(records)
    for name, why in sorted(STATE.missing.items()):
        logger.warning(
            "dsparklab: vLLM %s (line %s): %s; not recorded: %s",
            version,
            line,
            why,
            "; ".join(lost[name]) or "nothing",
        )
    if not STATE.originals:
        raise UnsupportedVLLMError(f"vLLM {version}: no patch point found")
    runs.STATE.line = line
    runs.STATE.installed = tuple(
        f"{owner.__module__}.{owner.__name__}.{name}" for owner, name in STATE.originals
    )
    logger.info(
        "dsparklab: vLLM %s taps installed (line %s, trace dir %s, level %s)",
        version,
        line,
        config.trace_dir,
        config.level,
    )
    return sorted(STATE.missing)


def uninstall() -> None:
    """Restore every patched attribute (tests; a running engine keeps its buffers)."""
    for (owner, name), original in list(STATE.originals.items()):
        if original is _MISSING_ATTR:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    STATE.originals.clear()
    STATE.missing.clear()
    STATE.line = None


def _set_attr(owner: type, name: str, value: Any) -> None:
    if (owner, name) in STATE.originals:
        return
    STATE.originals[(owner, name)] = owner.__dict__.get(name, _MISSING_ATTR)
    setattr(owner, name, value)


def _patch(owner: type, name: str, make: Callable[[Any], Any]) -> None:
    current = owner.__dict__.get(name)
    if current is None:  # inherited: wrap what the class resolves to
        current = getattr(owner, name)
    if getattr(current, MARK, False):
        return
    _set_attr(owner, name, make(current))
