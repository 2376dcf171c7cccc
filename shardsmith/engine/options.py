"""The options every converting command shares (docs/design.md, "Command line")."""


from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class ConvertingOptions:
    """The options every converting command shares (docs/design.md, "Command line")."""

    seed: int = 0
    shuffle: bool = True
    workers: int = 1
    memory: int = 1_000_000_000
    splits: tuple[tuple[str, float], ...] = (("train", 1.0),)
    on_error: str = "fail"
    limit: int | None = None
    quiet: bool = False
    overwrite: bool = False
    # clusters: one stage of the run on rank ``rank`` of ``world_size`` (None: every stage, here)
    stage: str | None = None
    rank: int = 0
    world_size: int = 1
    # object storage: transient errors retried this many times, the n-th after up to wait * 2**n seconds
    retries: int = 5
    retry_wait: float = 0.5
    # outputs to object storage (-o s3://...): where the dataset is made before it is uploaded, the
    # part size of multipart uploads, and the URL itself once ``out`` names the staging folder
    staging: Path | None = None
    part_size: int | None = None
    out_url: str | None = None
    # text: drop duplicates and benchmark overlaps, list what was dropped, trace tokens to their documents
    # (text/cleaning.py); events: --provenance stores each event's file and entry (core/provenance.py)
    dedup: str | None = None
    dedup_threshold: float = 0.8
    decontaminate: tuple[str, ...] = ()
    decontaminate_ngram: int = 13
    decontaminate_field: str = "text"
    removed: str | None = None
    provenance: bool = False

    def __post_init__(self) -> None:
        """``out`` given as a string (the Python API) is the path or the URL it names, as ``-o`` makes it."""
        out = getattr(self, "out", None)
        if isinstance(out, str):
            from shardsmith.core.urls import is_url

            if not is_url(out):
                object.__setattr__(self, "out", Path(out))

    def idle_rank(self) -> bool:
        """Whether this rank has nothing to do in its stage (plan and finalize are one process: rank 0)."""
        return self.stage in ("plan", "finalize") and self.rank != 0
