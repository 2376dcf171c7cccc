"""Every sample of a tar shard at once: the member table (``ShardMembers``) that the sample offsets
delimit, read one member level at a time in numpy; doubtful samples go to ``parse_sample``.

``scan_samples`` (in ``tarfmt``) drives ``_Scan`` block by block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from shardsmith.formats.webdataset.tarcheck import _check_headers, _scratch
from shardsmith.formats.webdataset.tarheader import BLOCK, MAX_NAME


class ShardMembers(NamedTuple):
    """A shard's samples as arrays: the members of sample j are ``first[j]:first[j + 1]``."""

    keys: list[str]
    first: np.ndarray  # int64, n + 1
    data: np.ndarray  # int64: where each member's bytes start
    size: np.ndarray  # int64
    ext: np.ndarray  # int64: index into exts
    exts: list[str]  # in order of first use


_FREE_LEVELS = 8  # member levels always done in numpy; past them a handful of long samples…
_FEW = 64  # …go to parse_sample, so that a few huge samples do not cost a numpy round per member

# parse_sample's signature: (buf, start, stop, end, *, where) -> (key, [(ext, data offset, size)])
_ParseSample = Callable[..., tuple[str, list[tuple[str, int, int]]]]


class _Scan:
    """scan_samples' state: members found so far, block by block, and which samples are slow."""

    def __init__(self, buf: Any, bounds: np.ndarray, where: str, parse_sample: _ParseSample) -> None:
        self.buf, self.bounds, self.where = buf, bounds, where
        self.parse_sample = parse_sample  # the slow path: given by the caller, which looks it up
        self.n = n = max(len(bounds) - 1, 0)
        count = len(buf) // BLOCK
        self.blocks = (np.frombuffer(buf, np.uint8, count=count * BLOCK) if count else np.zeros(0, np.uint8)
                       ).reshape(count, BLOCK)
        starts, stops = bounds[:-1], bounds[1:]
        self.end = int(bounds[-1]) if n else 0
        # parse_members' range test: samples that fail it raise there
        self.fast = (starts >= 0) & (starts < stops) & (stops <= len(buf)) & (starts % BLOCK == 0) \
            & (stops % BLOCK == 0)
        self.keys: list[str] = [""] * n
        self.exts: list[str] = []
        self.ext_ids: dict[bytes, int] = {}
        self.parts: list[tuple[np.ndarray, ...]] = []  # (sample, data, size, ext) of fast samples
        self.scratch = _scratch()

    def block(self, a: int, b: int) -> None:
        """Samples a..b-1, one member level at a time."""
        bounds, fast = self.bounds, self.fast
        stops = bounds[1:]
        live = np.flatnonzero(fast[a:b]) + a
        # level 0 also reads the header where sample b starts: sample b-1's cut check compares it
        read = np.concatenate([live, [b]]) if b < self.n and fast[b] else live
        ok, size, names, length, dot = _check_headers(self.blocks, bounds[read] // BLOCK, self.scratch)
        names0 = np.zeros((b - a + 1, MAX_NAME), np.uint8)  # the raw name bytes where each sample starts
        names0[read - a] = names
        read0 = np.zeros(b - a + 1, bool)
        read0[read - a] = True
        dot0 = np.zeros(b - a + 1, np.int64)
        members: list[tuple[np.ndarray, ...]] = []
        level_exts: set[int] | None = set()  # one extension per level, all different: none repeats
        pos = bounds[live]
        level = 0
        while live.size:
            if level == 0:
                ok, size, names, length, dot = (x[:len(live)] for x in (ok, size, names, length, dot))
            elif level >= _FREE_LEVELS and live.size < _FEW:
                fast[live] = False
                break
            else:
                ok, size, names, length, dot = _check_headers(self.blocks, pos // BLOCK, self.scratch)
            ok &= (dot > 0) & (dot + 1 < length)  # a key and an extension
            if level == 0:
                dot0[live - a] = dot
            else:  # the same key: equal bytes up to and including the dot
                width = int(dot.max()) + 1
                key0 = names0[:len(live), :width] if len(live) == b - a else names0[live - a, :width]
                ok &= _first_difference(names[:, :width], key0) > dot
            nxt = pos + BLOCK + size + (-size % BLOCK)
            ok &= nxt <= stops[live]
            if ok.all():  # (the usual case: no copies)
                ext = self._ext_ids(names, dot, length)
            else:
                ext = np.full(len(live), -1)
                ext[ok] = self._ext_ids(names[ok], dot[ok], length[ok])
            ok &= ext >= 0
            if not ok.all():
                fast[live[~ok]] = False
                live, pos, size, ext, nxt = live[ok], pos[ok], size[ok], ext[ok], nxt[ok]
            members.append((live, pos + BLOCK, size, ext))
            if level_exts is not None and len(ext):
                first = int(ext[0])
                level_exts = None if first in level_exts or (ext != first).any() else level_exts | {first}
            more = nxt < stops[live]
            live, pos = live[more], nxt[more]
            level += 1
        self._finish_block(a, b, members, names0, read0, dot0, level_exts is None)

    def _ext_ids(self, names: np.ndarray, dot: np.ndarray, length: np.ndarray) -> np.ndarray:
        """Extension ids of names (ok so far): each ``names[i, dot[i]+1:length[i]]``; -1 if not UTF-8."""
        m = len(names)
        if not m:
            return np.zeros(0, np.int64)
        width = int((length - dot).max()) - 1
        cols = dot[:, None] + 1 + np.arange(width)
        ext = np.take_along_axis(names, np.minimum(cols, MAX_NAME - 1), axis=1)
        ext[cols >= length[:, None]] = 0
        if (ext == ext[0]).all():
            uniq, inverse = ext[:1], np.zeros(m, np.int64)
        else:
            uniq, inverse = np.unique(ext, axis=0, return_inverse=True)
        ids = np.empty(len(uniq), np.int64)
        for u, row in enumerate(uniq):
            raw = row.tobytes().rstrip(b"\x00")
            if raw not in self.ext_ids:
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    ids[u] = -1
                    continue
                self.ext_ids[raw] = len(self.exts)
                self.exts.append(text)
            ids[u] = self.ext_ids[raw]
        return ids[inverse.reshape(-1)]

    def _finish_block(self, a: int, b: int, members: list[tuple[np.ndarray, ...]], names0: np.ndarray,
                      read0: np.ndarray, dot0: np.ndarray, repeats: bool) -> None:
        fast = self.fast
        if not members:
            return
        sample, data, size, ext = (np.concatenate(x) for x in zip(*members))
        if repeats:  # an extension may repeat: look for two members of one sample with the same id
            codes = sample * (len(self.exts) + 1) + ext
            codes.sort()
            fast[codes[1:][codes[1:] == codes[:-1]] // (len(self.exts) + 1)] = False
        # the cut check: the bytes at sample j's end must not start with its key and a dot
        ahead = np.flatnonzero(fast[a:b])
        ahead = ahead[self.bounds[ahead + a + 1] < self.end]
        width = int(dot0.max()) + 1
        if len(ahead) and ahead[-1] == len(ahead) - 1:  # 0, 1, 2, …: a view is cheaper than a copy
            cut = _first_difference(names0[1:len(ahead) + 1, :width], names0[:len(ahead), :width]) \
                > dot0[:len(ahead)]
        else:
            cut = _first_difference(names0[ahead + 1, :width], names0[ahead, :width]) > dot0[ahead]
        cut |= ~read0[ahead + 1]  # not read (the next range is not whole blocks): parse_sample looks
        fast[ahead[cut] + a] = False
        # keys: UTF-8 up to the first dot
        ready = np.flatnonzero(fast[a:b])
        every = len(ready) == b - a
        names0, dot0 = (names0[:b - a], dot0[:b - a]) if every else (names0[ready], dot0[ready])
        if len(dot0) and dot0.min() == dot0.max():  # keys of one length: cut the names there
            width, step = int(dot0[0]), 1
            raw = np.ascontiguousarray(names0[:, :width]).view(f"S{width}").reshape(-1).tolist()
        else:  # a NUL for each name's first dot: b"key\0ext", two strings once split at NULs
            names0[np.arange(len(names0)), dot0] = 0
            raw = names0.view(f"S{MAX_NAME}").reshape(-1).tolist()
            step = 2
        try:
            texts = b"\x00".join(raw).decode("utf-8").split("\x00")[::step]
        except UnicodeDecodeError:  # UTF-8 is self-synchronising: only the bad keys fail alone
            raw = [k.partition(b"\x00")[0] for k in raw]
            texts = [k.decode("utf-8", "replace") for k in raw]
            for i, k in zip(ready.tolist(), raw):
                try:
                    k.decode("utf-8")
                except UnicodeDecodeError:
                    fast[i + a] = False
        if every:
            self.keys[a:b] = texts
        else:
            for i, text in zip(ready.tolist(), texts):
                self.keys[i + a] = text
        keep = fast[sample]
        order = np.argsort(sample[keep], kind="stable")  # sample order, levels in order within one
        self.parts.append(tuple(x[keep][order] for x in (sample, data, size, ext)))

    def finish(self) -> ShardMembers:
        parts = self.parts
        slow = np.flatnonzero(~self.fast)
        if len(slow):
            rows: list[tuple[int, int, int, int]] = []
            ids = {ext: i for i, ext in enumerate(self.exts)}
            for j in slow.tolist():
                start, stop = int(self.bounds[j]), int(self.bounds[j + 1])
                key, found = self.parse_sample(self.buf, start, stop, self.end, where=self.where)
                self.keys[j] = key
                for ext, data, size in found:
                    if ext not in ids:
                        ids[ext] = len(self.exts)
                        self.exts.append(ext)
                    rows.append((j, data, size, ids[ext]))
            extra = np.array(rows, np.int64).reshape(-1, 4).T
            parts = [*parts, tuple(extra)]
        sample, data, size, ext = (np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64)
                                   for i in range(4))
        if len(slow):
            order = np.argsort(sample, kind="stable")
            sample, data, size, ext = sample[order], data[order], size[order], ext[order]
        first = np.zeros(self.n + 1, np.int64)
        np.cumsum(np.bincount(sample, minlength=self.n), out=first[1:])
        # number extensions by first use, as a member-by-member parse would
        used, at = np.unique(ext, return_index=True)
        used = used[np.argsort(at)]
        renumber = np.zeros(len(self.exts), np.int64)
        renumber[used] = np.arange(len(used))
        return ShardMembers(self.keys, first, data, size, renumber[ext], [self.exts[u] for u in used.tolist()])


def _first_difference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per row, the first column where x and y differ (their width when they are equal)."""
    diff = x != y
    first = diff.argmax(axis=1)
    return np.where(diff[np.arange(len(x)), first], first, x.shape[1])
