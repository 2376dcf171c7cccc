"""What a report section is built from, below the formats and sources that build them: the model
(``model``: ``Section``, ``Table``, ``Figure``, the ``Sampling`` bounds), the figures (``figures``:
matplotlib, imported only when a figure is drawn), and the sections shared by several kinds of
data: images (``image_stats``), events (``event_stats``), raw inputs by what a source holds
(``raw_inputs``, the default ``Reader.report``), and what a dataset's report reads of its splits
(``dataset_sample``, for the formats' ``formats/<name>/report.py``). ``shardsmith.report`` renders
them as HTML."""
