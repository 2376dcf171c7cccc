"""``pack-tokens --nanogpt``'s splits: nanoGPT's ``train.py`` samples windows from ``train.bin`` and
``val.bin``, so both must exist and hold documents.

Without ``--split``, a val share is held out as nanoGPT's prepare scripts do (openwebtext: 0.0005 of
the documents; shakespeare: 0.1 of the text): 0.0005, raised for a small corpus until it holds about
``VAL_DOCUMENTS`` documents (at most ``MAX_SHARE``). A document's split is still a hash of its
identity, so the share is an expectation: the corpus size comes from the engine check's sample
(its document count when it read the whole input, else the input bytes over the sample's
characters per document), and a split left empty all the same is refused with the share to give.

The figures: 0.0005, raised for a small corpus so that it holds about 20 documents, at most 0.1,
with two significant digits (3,000 documents get 0.0056); the share is recorded as
``nanogpt_default_val`` and said in the summary. A tiny corpus may draw none for val (20 documents at
0.1: one corpus in eight): the run then stops before the manifest with a usage error naming a share
that would hold about 20 of its documents (``--split train=0.8,val=0.2``), and leaves nothing behind;
an empty ``train``, or an empty split of an explicit ``--split``, is refused the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsmith.errors import UsageError

DEFAULT_SHARE = 0.0005
VAL_DOCUMENTS = 20  # the default share aims at this many val documents in a small corpus
MAX_SHARE = 0.1
SUGGESTED = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)  # the shares an error names (else 0.2)


@dataclass(frozen=True, kw_only=True)
class Sample:
    """The first documents of the input: their texts (cut for the engine check), how many characters
    they held whole, and whether they are the whole input."""

    texts: list[str]
    chars: int
    whole: bool


def check_names(splits: tuple[tuple[str, float], ...]) -> bool:
    """Whether ``--nanogpt`` takes the default val share (``--split`` gave one train split, or none);
    splits without a train and a val are refused."""
    names = [name for name, _ in splits]
    if names == ["train"]:
        return True
    if "train" not in names or "val" not in names:
        raise UsageError(f"--nanogpt: nanoGPT's train.py reads train.bin and val.bin, but --split names "
                         f"{', '.join(names)}: name a train and a val split (e.g. --split train=0.99,val=0.01)")
    return False


def default_share(sample: Sample, *, input_bytes: int) -> float:
    """The val share for this input: ``DEFAULT_SHARE``, or more for a corpus of fewer than
    ``VAL_DOCUMENTS / DEFAULT_SHARE`` documents (two significant digits)."""
    if sample.whole:
        documents = float(len(sample.texts))
    else:
        documents = input_bytes * len(sample.texts) / max(1, sample.chars)
    share = min(MAX_SHARE, max(DEFAULT_SHARE, VAL_DOCUMENTS / max(documents, 1.0)))
    return float(f"{share:.2g}")


def splits_with(share: float) -> tuple[tuple[str, float], ...]:
    return (("train", round(1 - share, 12)), ("val", share))


def check_filled(documents: dict[str, int], *, default: bool) -> None:
    """train.py samples windows from both files: an empty one (a tiny corpus, whose few documents
    all drew train) is refused, with a share that would hold about ``VAL_DOCUMENTS`` of them."""
    for name in ("train", "val"):
        if documents.get(name, 0) == 0:
            total = sum(documents.values())
            given = "the default val share of --nanogpt" if default else "--split"
            share = next((s for s in SUGGESTED if s * total >= VAL_DOCUMENTS), 0.2)
            raise UsageError(f"--nanogpt: {given} left the {name} split empty ({total:,} documents in all), and "
                             f"nanoGPT's train.py needs documents in train.bin and val.bin: give {name} a larger "
                             f"share, e.g. --split train={1 - share:g},val={share:g}")
