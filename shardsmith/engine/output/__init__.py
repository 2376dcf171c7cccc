"""The output of a run: a local folder or a prefix in object storage, its lock or lease, the claim
that refuses another command's files, the run's identity, and the session that commits it."""
