"""Kept so that `harness.model.logits` still names the ranking; it lives in `harness.ranking`, which
stands alone (torch only) so that adapters can rank logits without importing the reference model."""

from harness.ranking import RankedLogits, rank_logits

__all__ = ["RankedLogits", "rank_logits"]
