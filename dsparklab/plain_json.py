"""Values as plain JSON: what notebooks record and what widgets send to the front end.

numpy arrays and scalars become Python lists and numbers, NaN and inf become null (the
Jupyter message protocol and strict JSON readers reject them), frames become records and
mapping keys become strings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from dsparklab.errors import DSparkLabError


def plain_json(value: Any, *, strict: bool = True) -> Any:
    """``value`` as plain JSON.

    With ``strict``, a value that is none of numbers, strings, bools, None, lists, dicts,
    numpy values or frames is a one-line error; without, it is passed through as it is.
    """
    if isinstance(value, pd.DataFrame):
        return [plain_json(r, strict=strict) for r in value.to_dict("records")]
    if isinstance(value, pd.Series):
        return plain_json(value.to_dict(), strict=strict)
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {str(k): plain_json(v, strict=strict) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v, strict=strict) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is pd.NA or value is pd.NaT:  # a pandas missing value is null
        return None
    if not strict or value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise DSparkLabError(
        f"expected JSON-like values (numbers, strings, lists, dicts, frames); got "
        f"{type(value).__name__}; convert it first"
    )
