"""One registry of validated figure defaults, in the manner of ArviZ's ``rcParams``.

Builders fall back to :data:`settings` when an argument is ``None``; an unknown key or a
bad value raises at once, naming the valid keys or the expected value.

>>> from dsparklab.plots import settings
>>> settings["figure.height"] = 480
>>> settings["figure.hieght"] = 480  # doctest: +SKIP
UnknownMethodError: unknown plot setting 'figure.hieght'; expected one of ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

from dsparklab.errors import ConfigError, UnknownMethodError
from dsparklab.plots.style import TEMPLATE_NAME


def _positive_int(name: str) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"plot setting {name!r} must be a positive int, got {value!r}")
        return value

    return check


def _optional_positive_int(name: str) -> Callable[[Any], int | None]:
    check = _positive_int(name)
    return lambda value: None if value is None else check(value)


def _string(name: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"plot setting {name!r} must be a non-empty str, got {value!r}")
        return value

    return check


def _fraction(name: str) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            raise ConfigError(f"plot setting {name!r} must be in (0, 1), got {value!r}")
        return float(value)

    return check


# key -> (default, validator)
DEFAULTS: dict[str, tuple[Any, Callable[[Any], Any]]] = {
    "figure.template": (TEMPLATE_NAME, _string("figure.template")),
    "figure.height": (420, _positive_int("figure.height")),
    "figure.panel_height": (300, _positive_int("figure.panel_height")),
    "figure.width": (None, _optional_positive_int("figure.width")),
    "figure.max_facets": (12, _positive_int("figure.max_facets")),
    "figure.ci_opacity": (0.18, _fraction("figure.ci_opacity")),
    "figure.value_format": (".2f", _string("figure.value_format")),
}


class PlotSettings(MutableMapping[str, Any]):
    """Validated figure defaults; keys are fixed, values checked on assignment."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {key: default for key, (default, _) in DEFAULTS.items()}

    def _check_key(self, key: str) -> None:
        if key not in DEFAULTS:
            raise UnknownMethodError(
                f"unknown plot setting {key!r}; expected one of {', '.join(sorted(DEFAULTS))}"
            )

    def __getitem__(self, key: str) -> Any:
        self._check_key(key)
        return self._values[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._check_key(key)
        self._values[key] = DEFAULTS[key][1](value)

    def __delitem__(self, key: str) -> None:
        """Deleting a key restores its default."""
        self._check_key(key)
        self._values[key] = DEFAULTS[key][0]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def reset(self) -> None:
        """Every key back to its default."""
        for key in DEFAULTS:
            del self[key]

    @contextmanager
    def overridden(self, values: Mapping[str, Any]) -> Iterator[None]:
        """These values (checked as on assignment) inside the block, the previous ones
        after it, also on an error."""
        saved = {key: self[key] for key in values}
        try:
            for key, value in values.items():
                self[key] = value
            yield
        finally:
            self._values.update(saved)

    def __repr__(self) -> str:
        return f"PlotSettings({self._values!r})"


settings = PlotSettings()
