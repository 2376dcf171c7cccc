"""WebDataset tar shards of samples (images, JSON, text, columns): writer and dataset."""
