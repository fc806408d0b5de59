"""Training the drafters (DSpark and Eagle3, ``speculators`` models) on target hidden states.

Shared by every tier (tiny, smol). The modules, in the order data flows through them:

- :mod:`~dsparklab.zoo.training.config`: the drafters' settings (``DSparkConfig``,
  ``Eagle3Config``), which each tier's recipe fills in;
- :mod:`~dsparklab.zoo.training.data`: :class:`~dsparklab.zoo.training.data.DraftData`
  (sequences and the target's hidden states over them), batch packing and the batch stream;
- :mod:`~dsparklab.zoo.training.loop`: the optimizer loop (steps or a wall budget,
  resumable state, learning-curve milestones);
- :mod:`~dsparklab.zoo.training.checkpoint`: speculators-format checkpoints that vLLM and
  the reference engine load (draft vocabulary, verifier path);
- :mod:`~dsparklab.zoo.training.drafters`: ``train_dspark`` and ``train_eagle3``;
- :mod:`~dsparklab.zoo.training.report`: what a stage did, for the cards (no torch, so
  ``dsparklab zoo cards`` runs without it).

Only the torch-free modules are imported here; import the others by their module path.
"""
