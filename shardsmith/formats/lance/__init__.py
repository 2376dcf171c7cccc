"""A Lance dataset per split (pylance: ``lance.dataset(OUT / "train.lance").take([...])``), one data
file per shard, each sample field a typed column and ``__key__`` a column too, in the shuffle's order."""
