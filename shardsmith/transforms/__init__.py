"""Transforms: work done once, offline, on each sample (augmenting images, selecting fields, an
event's payload). Tokenizing text lives in ``shardsmith.text``."""
