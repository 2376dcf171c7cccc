"""The copy mode: whole input files (unaugmented images) into shards, planned from the listing alone."""
