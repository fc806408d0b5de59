"""The zoo's tiers and their card renderers, registered in one place.

:mod:`dsparklab.zoo.card` holds what every tier's cards share and imports no tier; each
tier's ``card`` module draws its cards from it, and this module maps a card's ``tier``
to its renderer, so rewriting a card (:func:`add_decode_time`) needs no tier-specific code.
Nothing here imports torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsparklab.errors import DSparkLabError
from dsparklab.zoo.card import CARD_JSON, CARD_MD, decode_time_acceptance, read_card, write_atomic
from dsparklab.zoo.smol.card import render_smol_card
from dsparklab.zoo.tiny.card import render_card

CARD_RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "tiny": render_card,
    "smoke": render_card,
    "smol": render_smol_card,
    "smol-smoke": render_smol_card,
}
"""A card's ``tier`` -> the function that draws its ``CARD.md``."""


def render(card: dict[str, Any]) -> str:
    """The Markdown of ``card``, drawn by its tier's renderer."""
    tier = str(card.get("tier"))
    renderer = CARD_RENDERERS.get(tier)
    if renderer is None:
        raise DSparkLabError(
            f"card of {card.get('name')!r}: unknown tier {tier!r}; expected one of "
            f"{', '.join(CARD_RENDERERS)}"
        )
    return renderer(card)


def add_decode_time(checkpoint_dir: Path, runs_root: Path) -> bool:
    """Write :func:`~dsparklab.zoo.card.decode_time_acceptance` into a drafter's card and
    redraw its ``CARD.md``; False if no runs match."""
    card = read_card(checkpoint_dir)
    decode = decode_time_acceptance(checkpoint_dir, runs_root)
    if not card or not decode:
        return False
    card.setdefault("evaluation", {})["decode_time"] = decode
    text = render(card)
    write_atomic(checkpoint_dir / CARD_JSON, json.dumps(card, indent=2) + "\n")
    write_atomic(checkpoint_dir / CARD_MD, text)
    return True
