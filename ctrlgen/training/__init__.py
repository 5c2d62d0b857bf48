"""Prefix tuning with a privacy-masked loss (METHOD.md section 5): the Ray-free parts."""

from ctrlgen.training.loss import LossTerms, LossWeights, Objective, masked_prefix_loss
from ctrlgen.training.masking import private_token_mask

__all__ = ["LossTerms", "LossWeights", "Objective", "masked_prefix_loss", "private_token_mask"]
