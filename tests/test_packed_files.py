"""The copy mode's packed listing (core/packed_files.py) gives back exactly the files it packed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shardsmith.core.input_file import InputFile
from shardsmith.core.packed_files import PackedFiles

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12) | st.just("caf\udce9")  # undecodable byte
_files = st.lists(st.builds(InputFile, path=_text, rel=_text, index=st.integers(0, 2**40), size=st.integers(0, 2**50),
                            group=_text, mtime_ns=st.integers(0, 2**62), ctime_ns=st.integers(0, 2**62),
                            ino=st.integers(0, 2**62), origin=_text), max_size=20)


@given(_files, st.data())
def test_any_range_comes_back_as_it_was_packed(files, data):
    packed = PackedFiles.of(files)
    assert len(packed) == len(files)
    start = data.draw(st.integers(0, len(files)))
    stop = data.draw(st.integers(start, len(files)))
    assert packed.take(start, stop) == tuple(files[start:stop])
