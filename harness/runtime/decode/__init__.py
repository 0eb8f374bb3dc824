"""Decode graphs: one captured graph per key with padding, capture scope, pointer records and the
strict check (`runner.py`); `DecoderGraphs`, the warmup-and-capture flow with its passes and its
serving (`graphs.py`), split along its jobs: the capture policy the engine is given (`policy.py`),
rank agreement (`agreement.py`), the single-pass blockers (`blockers.py`), dummy batches
(`dummy.py`), and which graph a batch replays with its fallback accounting (`serving.py`)."""
