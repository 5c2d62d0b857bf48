"""Logits stages as tensors in, tensors out: per-row blocking automata and counter-keyed sampling."""
