"""Token ids as text for the token strips: the tokenizer of the runs' target."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dsparklab.lab.runs import Runs

logger = logging.getLogger(__name__)


def load_token_text(runs: Runs) -> Callable[[int], str]:
    """Token id -> text from the runs' target tokenizer (``tokenizer.json``); else ``str``.

    The first run whose target holds a ``tokenizer.json`` decides (runs compared in one
    notebook share a target). Without one (synthetic runs, a vLLM run whose model lives
    elsewhere) the ids themselves are the text.
    """
    for record in runs.runs[["path", "root"]].to_dict("records"):
        meta = runs.catalog.run_json(record["path"])
        tokenizer_file = _find_tokenizer(Path(record["path"]), Path(record["root"]), meta)
        if tokenizer_file is None:
            continue
        try:
            from tokenizers import Tokenizer
        except ImportError:
            logger.warning("tokenizers is not installed; tokens are shown as ids")
            break
        return _decoder(Tokenizer.from_file(str(tokenizer_file)))
    return str


def _find_tokenizer(run_path: Path, root: Path, meta: Mapping[str, Any]) -> Path | None:
    """A run's ``tokenizer.json``: in its target directory as recorded, in the zoo under
    the target's name, or in a directory between the run and its root (shipped traces carry
    their target's tokenizer in their store, the target itself being too large to commit)."""
    from dsparklab.zoo import ZOO_DIR

    target = meta.get("target") or {}
    candidates = [Path(str(target["path"]))] if target.get("path") else []
    if target.get("name"):
        candidates.append(ZOO_DIR / str(target["name"]))
    candidates += [p for p in run_path.parents if p.is_relative_to(root)]
    return next(
        (c / "tokenizer.json" for c in candidates if (c / "tokenizer.json").is_file()), None
    )


def _decoder(tokenizer: Any) -> Callable[[int], str]:
    @functools.cache
    def decode(token: int) -> str:
        return str(tokenizer.decode([int(token)], skip_special_tokens=False))

    return decode
