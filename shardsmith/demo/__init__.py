"""Small synthetic inputs for the demo and the tests (ROOT files, IceCube-like Parquet)."""
