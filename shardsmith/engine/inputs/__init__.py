"""A job's inputs: files and folders found and identified (a folder listed to disk), URLs listed and
staged, and the tasks planned over them once per run."""
