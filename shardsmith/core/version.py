"""The version of shardsmith, recorded in every manifest (``pyproject.toml`` says the same)."""

__version__ = "0.1.0"
