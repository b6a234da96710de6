"""Training: distilling a draft for a target (``specdec-fast train-draft``: collect, fit, card)
and learning a draft-length policy from traces (``specdec-fast train-policy``)."""
