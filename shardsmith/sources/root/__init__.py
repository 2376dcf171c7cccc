"""ROOT event files (TTree and RNTuple) through uproot: numeric branches as columnar ``EventChunk``s.

An event is one entry; its identity is (file, entry). Flat scalars and fixed-size arrays become
fixed fields; jagged branches become ragged fields, and branches that share a counter (``NJet``
for ``Jet_Px`` and ``Jet_Py``, or one RNTuple collection) share one offsets array. Values come
out of the awkward layout's buffers (offsets and content) without a copy per event. Tasks are
entry ranges cut at cluster boundaries; each task is read in steps of bounded uncompressed size
so memory stays flat for files larger than RAM.
"""

from shardsmith.sources.root.chunks import _to_chunk
from shardsmith.sources.root.files import _open
from shardsmith.sources.root.reader import RootReader
from shardsmith.sources.root.schema import _Leaf

__all__ = ["RootReader", "_Leaf", "_open", "_to_chunk"]
