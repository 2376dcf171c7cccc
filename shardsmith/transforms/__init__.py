"""Transforms: work done once, offline, on each sample (tokenizing, augmenting)."""
