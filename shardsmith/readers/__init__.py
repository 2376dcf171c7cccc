"""Readers: one input kind each; they plan tasks over files and yield (record number, record)."""
