"""The model zoo: the project's own small target LM and its DSpark and Eagle3 drafters.

Only this package imports training stacks (``speculators``). Checkpoints live under
:data:`ZOO_DIR` and are made by ``dsparklab zoo train`` (recipe: ``dsparklab.zoo.tiny``).
"""

from dsparklab.zoo.load import (
    DRAFTER_ATTN_IMPLEMENTATION,
    ZOO_DIR,
    load_dspark_drafter,
    load_eagle3_drafter,
    load_target,
    resolve_verifier_path,
    zoo_path,
)

__all__ = [
    "DRAFTER_ATTN_IMPLEMENTATION",
    "ZOO_DIR",
    "load_dspark_drafter",
    "load_eagle3_drafter",
    "load_target",
    "resolve_verifier_path",
    "zoo_path",
]
