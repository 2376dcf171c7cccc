"""Object storage and URLs, for inputs, outputs and the loader: one table of schemes, listing,
staging, uploads, retries, and one-line errors. Imports only errors and core."""
