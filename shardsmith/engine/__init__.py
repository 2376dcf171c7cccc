"""The engine: job planning, scatter, keyed shuffle, gather, workers, resume, output folder, faults."""
