"""The CPU reference engine: lossless DSpark and Eagle3 draft-and-verify with full traces."""

from dsparklab.engines.reference.config import METHODS, ReferenceConfig
from dsparklab.engines.reference.core import (
    Generation,
    PositionRecord,
    ReferenceEngine,
    StepRecord,
    Verdict,
    record_row,
    verify_greedy,
    verify_rejection,
)
from dsparklab.engines.reference.markov import (
    MarkovHeadWeights,
    MarkovStepResult,
    dspark_markov_step,
    map_draft_to_target,
)
from dsparklab.engines.reference.models import (
    ContextUpdate,
    DraftSettings,
    DSparkDrafter,
    Eagle3Drafter,
    Proposal,
    TargetRunner,
    make_drafter,
)

__all__ = [
    "METHODS",
    "ContextUpdate",
    "DSparkDrafter",
    "DraftSettings",
    "Eagle3Drafter",
    "Generation",
    "MarkovHeadWeights",
    "MarkovStepResult",
    "PositionRecord",
    "Proposal",
    "ReferenceConfig",
    "ReferenceEngine",
    "StepRecord",
    "TargetRunner",
    "Verdict",
    "dspark_markov_step",
    "make_drafter",
    "map_draft_to_target",
    "record_row",
    "verify_greedy",
    "verify_rejection",
]
