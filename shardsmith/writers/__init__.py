"""Writers: one output format each; they roll shards over, write atomically and hash while writing."""
