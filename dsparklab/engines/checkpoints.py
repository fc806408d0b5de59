"""Checkpoints as run.json records them: name, path and one content hash for every engine.

The hash is :func:`dsparklab.provenance.checkpoint_hash` (every file's bytes, the cards
left out), the one the committed traces and the zoo cards carry, whichever engine
recorded the run. It reads every byte of the checkpoint (also a large one: one rule, so
that a hash never depends on which engine recorded the run).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsparklab.provenance import checkpoint_hash


@dataclass(frozen=True)
class ModelRef:
    """A checkpoint as run.json records it."""

    name: str
    path: Path
    content_hash: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "path": str(self.path), "content_hash": self.content_hash}


def resolve_model(name_or_path: str | Path) -> ModelRef:
    """A zoo name (``tiny-dspark``) or a checkpoint directory -> its path and hash."""
    path = Path(name_or_path)
    if not (path / "config.json").is_file():
        from dsparklab.zoo import zoo_path

        path = zoo_path(str(name_or_path))
    path = path.resolve()
    return ModelRef(name=path.name, path=path, content_hash=checkpoint_hash(path))


CUSTOM_TIER = "custom"
_ZOO_ROLES = ("target", "dspark", "eagle3")


def model_tier(ref: ModelRef) -> str:
    """The zoo tier of a checkpoint: its card's ``tier``, else the tier its zoo name
    carries (``smol-target`` -> ``smol``); ``custom`` for anything else."""
    from dsparklab.zoo.card import read_card
    from dsparklab.zoo.tiers import CARD_RENDERERS

    tier = read_card(ref.path).get("tier") if ref.path.is_dir() else None
    if tier:
        return str(tier)
    for known in sorted(CARD_RENDERERS, key=len, reverse=True):
        if ref.name in {f"{known}-{role}" for role in _ZOO_ROLES}:
            return known
    return CUSTOM_TIER


def models_tier(target: ModelRef, drafter: ModelRef | None) -> str:
    """The tier a run's models share (``custom`` when they differ or are not the zoo's)."""
    tiers = {model_tier(ref) for ref in (target, drafter) if ref is not None}
    return tiers.pop() if len(tiers) == 1 else CUSTOM_TIER
