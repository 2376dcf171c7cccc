"""Fixed-shape event arrays (N x L x F) that a model reads with plain ``np.memmap``."""
