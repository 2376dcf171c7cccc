"""Formats: one package per on-disk format, holding its writer and its dataset."""
