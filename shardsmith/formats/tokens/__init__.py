"""Packed token arrays (Megatron .bin/.idx, nanoGPT .bin): writer and dataset."""
