"""The keyed shuffle: the scatter into part files, the plan of every split, the gather into shards,
the spill given back as it goes, and the dedup decided between them; ``run.convert_units`` runs its units."""
