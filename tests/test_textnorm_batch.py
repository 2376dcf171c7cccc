"""``textnorm_batch.normalize_batch`` against ``textnorm.normalize``, its reference: the same text and
the same hash for every document, whatever the batch holds."""

from __future__ import annotations

import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsmith.text import textnorm, textnorm_batch
from shardsmith.text.textnorm_batch import normalize_batch

# what the batch treats apart: ß, final sigma, İ, the Cherokee that folds to upper case, micro, long s,
# a ligature, fullwidth letters, combining marks, every kind of space, NUL, a lone surrogate
SPECIAL = ["ß", "ẞ", "Σ", "ς", "İ", "ı", "ꭰ", "Ꭰ", "µ", "ſ", "ﬁ", "ﬃ", "Ａ", "ｂ", "\u0301", "e\u0301", "\u0345",
           "ΐ", "ǅ", "\u1fbd", "\u00a8", "\ua7cb", "\U00010d50", "\x00", "\ud800", "A", "x", "."] + \
          [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=30) \
    | st.text(alphabet=st.characters(), max_size=30) \
    | st.lists(st.sampled_from(SPECIAL), max_size=14).map("".join)


def same_as_reference(texts: list[str]) -> None:
    batch = normalize_batch(texts)
    assert list(batch) == [textnorm.normalize(t) for t in texts]
    assert np.array_equal(textnorm_batch.doc_hashes(batch), textnorm.doc_hashes(texts))


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(TEXT, max_size=8))
def test_batch_equals_normalize_for_any_text(texts):
    same_as_reference(texts)


def test_every_code_point_in_context():
    """Each code point between others (cased letters, spaces) in batches of 2,000: the same as per document."""
    cps = [c for c in range(1, sys.maxunicode + 1) if not 0xD800 <= c < 0xE000]
    texts = ["A " + " x".join(map(chr, cps[i:i + 2000])) + "Σ " for i in range(0, len(cps), 2000)]
    same_as_reference(texts)
    same_as_reference(["".join(map(chr, cps[i:i + 2000])) for i in range(0, len(cps), 2000)])


def test_edges():
    same_as_reference([])
    same_as_reference(["", " ", "\n\n", "  a  ", "ß", "\u2028x\u2029", "a\ud800 B"])
    same_as_reference(["Straße\u00a0 WORLD\n", "ꭰ and ß", "ΣΑΣ ς"])  # one text that takes ``normalize`` among others


def test_the_checked_tables_make_the_fast_path_the_rule():
    """Most cased code points are lowered by Arrow (only a few hundred replaced or sent to ``normalize``)."""
    table, fixes = textnorm_batch._fold_fixes()
    assert 0xDF in fixes and fixes[0xDF] == "ss" and table[0x13A0] == textnorm_batch.SLOW
    assert np.count_nonzero(table) < 1000 and not table[:0x80].any()
