"""What sources, transforms and formats build on: keys and splits, batches, the writer base and
its rollover, keyed orders, collation, dataset files and epoch walks, and what report sections are
built from (``sections``). Imports only errors, core and storage."""
