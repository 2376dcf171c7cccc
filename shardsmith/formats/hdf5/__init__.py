"""HDF5 event shards (ragged columns with shared offsets): writer and dataset."""
