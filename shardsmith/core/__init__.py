"""The data model and utilities every layer shares: manifest, event schema and codec, sizes, dtypes, files."""
