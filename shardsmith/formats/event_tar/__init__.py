"""Events in WebDataset tar shards (one .npy member per field): writer and dataset."""
