"""Decode graphs: one captured graph per key with padding, capture scope, pointer records and the
strict check (`runner.py`), and warmup-and-capture with its passes, rank agreement and fallback
(`graphs.py`)."""
