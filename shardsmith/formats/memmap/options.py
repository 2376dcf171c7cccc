"""The options of ``convert --to memmap`` (light: ``convert --help`` reads it without importing numpy)."""

from __future__ import annotations

from shardsmith.kit.options import MAX_INT32, FormatOptions, Option

OPTIONS = FormatOptions(to="memmap", options=(
    Option(name="max_len", type="int", low=1, high=MAX_INT32, metavar="L",
           help="Values per event; longer events are truncated (--keep), shorter padded with 0."),
    Option(name="dtype", choices=("float32", "float16"), default="float32",
           help="The dtype of the N x L x F values."),
    Option(name="keep", default="first", metavar="first|last|top:FIELD",
           help="Which L values an event longer than --max-len keeps (top: highest FIELD)."),
))
