"""``shardsmith inspect --report DIR``: a self-contained HTML report of a dataset or of raw inputs.

What a person looks at before training (class counts, lengths, value ranges), drawn with
matplotlib's Agg backend and embedded in one HTML file that opens offline. The content of each
kind of data sits beside the objects that read it: a format's ``report`` hook (``kit.format.Format``;
its sections in ``formats/<name>/report.py``) and a source's (``kit.reader.Reader``; by default
``kit/sections/raw_inputs.py``) return ``Section`` objects built with ``kit/sections``; this
package adds the splits and shards every dataset has (``dataset``) and writes the HTML (``html``).
matplotlib is the ``shardsmith[report]`` extra.

What bounds a report (``kit.sections.model.Sampling``): seeded samples of shards, samples, files,
ranges and records, and a deadline (30 s) after which a section says what it did not read. Raw
inputs are sampled through ``Reader.sample_tasks(file, count, chunk_bytes, rng)`` (default: a choice
of ``plan_file``'s tasks; JSONL: seeded offsets in a big file, from the next line on, with no pass
over the file). A new format adds its report in one method (e.g. calling
``kit.sections.event_stats.event_sections`` with an ``EventSample`` of what it read). Every string
from data is HTML-escaped; figures draw it as plain text (mathtext off). The report writes only into
its DIR, never into the dataset.
"""

from __future__ import annotations

from shardsmith.errors import UsageError, install_hint

HINT = f"the report needs matplotlib, which is not installed: {install_hint('report')}"


def need_matplotlib() -> None:
    """Fail in one line, before any work, when the extra is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(HINT) from None
