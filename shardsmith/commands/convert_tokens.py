"""``convert --to tokens``: the job of ``pack-tokens``, built from convert's options.

The tokens format is written by one job (``pack_tokens.job_of``, its steps in ``token_job.py``);
convert hands it its options record rewritten as ``pack-tokens``' (``PackTokensOptions``), so the
two commands run the same job, with the same run identity, and write the same bytes. The format
declares that it is written so (``FormatOptions.command``); ``convert.job_of`` asks the declaration.
Every option of pack-tokens' own is declared by the format (``--chat`` and its options too), so it
comes here by name among ``format_options``; the job's steps then check them together, as for
``pack-tokens`` (``chat_options.check_chat``). Convert's options that the token job has no use for
are refused (one line) unless left alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shardsmith.commands.convert_options import ConvertOptions
from shardsmith.commands.pack_tokens import PackTokensOptions, job_of
from shardsmith.engine import Job
from shardsmith.errors import UsageError
from shardsmith.formats.tokens.options import OPTIONS

# convert's own options (not the converting commands' shared ones) that a token job reads no value of,
# with their flags; the defaults they must keep are the command line's (``--step-size`` 64MB: not its
# record's, and a read size that never changes a token)
UNUSED = {"source": "--from", "check_images": "--check-images", "max_image_pixels": "--max-image-pixels",
          "augment": "--augment", "copies": "--copies", "quality": "--quality", "balance": "--balance",
          "tree": "--tree", "branches": "--branches", "group_by": "--group-by", "events_table": "--events-table"}
IGNORED = ("step_size", "to", "format_options")  # a read size; what picked this job; read below


def pack_options(opts: ConvertOptions) -> PackTokensOptions:
    """``opts`` as ``pack-tokens`` would have parsed the same flags: the shared options as they are,
    the ``--to tokens`` options by name, ``--text-field`` defaulting to pack-tokens' ``text``."""
    defaults = {f.name: f.default for f in dataclasses.fields(ConvertOptions)}
    for name, flag in UNUSED.items():
        if getattr(opts, name) != defaults[name]:
            raise UsageError(f"{flag} does not apply to --to {opts.to}: it tokenizes the --text-field of rows "
                             f"(JSONL, Parquet), as pack-tokens does")
    unknown = sorted(set(opts.format_options) - set(OPTIONS.names()))
    if unknown:  # given through the Python API: the command line refuses them before
        raise UsageError(f"--{unknown[0].replace('_', '-')} does not apply to --to {opts.to}")
    taken = {f.name for f in dataclasses.fields(PackTokensOptions)}
    shared: dict[str, Any] = {f.name: getattr(opts, f.name) for f in dataclasses.fields(ConvertOptions)
                              if f.name in taken and f.name not in (*UNUSED, *IGNORED)}
    if shared["text_field"] is None:  # convert's default (no text member) is pack-tokens' "text"
        del shared["text_field"]
    # typed and defaulted as the format declares them; an option both commands have (--provenance) is
    # the command's, unless given among the format's
    checked = OPTIONS.values(opts.format_options).as_dict()
    shared.update({n: v for n, v in checked.items() if n in opts.format_options or n not in shared})
    return PackTokensOptions(**shared)


def token_job(opts: ConvertOptions) -> Job:
    """The ``pack-tokens`` job ``convert --to tokens`` stands for."""
    return job_of(pack_options(opts))
