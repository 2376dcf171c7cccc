"""The output of a converting command: a local folder (``session``) or a prefix in object storage
(``outremote``), chosen from ``-o`` (a URL: its scheme is checked against the table of schemes,
``storage/schemes.py``, when its store is opened).

``output_for`` gives a local folder's session (``session.output_run``), or a prefix's
(``outremote.RemoteOutputRun``), whose ``localize(opts)`` hands the unchanged local pipeline a local
staging folder as ``out``: ``--staging DIR``, else ``$XDG_CACHE_HOME/shardsmith/outputs/<sha256 of the
URL>/<last part of the prefix>``, so the same URL resumes from the same folder (the scratch folder
and the lock sit beside it as for any output folder). The run fingerprint uses the URL
(``opts.out_url``), never the staging path, and ``--staging`` and ``--part-size`` are volatile like
``--workers``. Before it claims the prefix, the run checks that the staging disk has about the
inputs' size free (``claim(..., input_bytes=)``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from shardsmith.core.urls import is_url
from shardsmith.engine.output.session import OutputRun, held, output_run
from shardsmith.errors import UsageError
from shardsmith.storage import schemes


@contextlib.contextmanager
def output_for(opts: Any) -> Iterator[OutputRun]:
    """The session of a run with a converting command's options; pass ``session.localize(opts)``
    to the pipeline (for a URL, its ``out`` is the local staging folder)."""
    if not is_url(str(opts.out)):
        if opts.staging is not None or opts.part_size is not None:
            stores = " or ".join(f"-o {s}..." for s in schemes.known("outputs"))
            raise UsageError(f"--staging and --part-size apply to an output in object storage ({stores}), "
                             f"not to the folder {opts.out}")
        with output_run(out=opts.out, overwrite=opts.overwrite, stage=opts.stage, rank=opts.rank,
                        quiet=opts.quiet) as session:
            yield session
        return
    from shardsmith.engine.output.outremote import output_store, remote_session
    from shardsmith.engine.shuffle.outstages import staged_session

    store = output_store(url=str(opts.out), retries=opts.retries, retry_wait=opts.retry_wait, part_size=opts.part_size)
    if opts.stage is None:
        session = remote_session(url=str(opts.out), staging=opts.staging, overwrite=opts.overwrite, quiet=opts.quiet,
                                 store=store)
    else:  # one rank of a cluster stage: the bucket is the place ranks share
        session = staged_session(url=str(opts.out), stage=opts.stage, rank=opts.rank, staging=opts.staging,
                                 quiet=opts.quiet, store=store, nanogpt=getattr(opts, "nanogpt", False))
    session.out.mkdir(parents=True, exist_ok=True)
    try:
        with held(session, rank=opts.rank) as s:
            yield s
    finally:
        with contextlib.suppress(OSError):  # the staging folder and the cache's folder of this URL, if empty
            session.out.rmdir()
            if opts.staging is None:
                session.out.parent.rmdir()
