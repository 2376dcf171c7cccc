"""One module per CLI command; each imported only when its command runs."""
