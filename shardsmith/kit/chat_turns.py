"""The turn-by-turn rule's renders of prefixes (``kit/chat.py``), found in one render where the
template allows it.

Without ``{% generation %}`` blocks, assistant message k trains from the end of
``render(messages[:k], add_generation_prompt=True)`` to the end of ``render(messages[:k+1])``:
two renders of a prefix per assistant message, each as long as its prefix, so quadratic (45 s at
3,000 messages). Yet most of a prefix's render is the whole conversation's: a template reads its
messages as it goes, and until it reads something a prefix lacks (message k, or how many there
are) it writes the same text for both. So the whole conversation is rendered once more with its
messages in a ``Tracked`` sequence that notes each read and where in the text the render then
is; the render of ``messages[:k]`` is the whole render up to its first read past k, then what the
template writes after its loop over the messages, wherever that is certain:

- that first read is the loop's own step to message k, between two passes through its body (not
  a look ahead as ``loop.last`` makes, not a length);
- the loop writes straight to the output (no macro, call or set block buffers it), and once it
  ended the template reads no message and no state (a namespace, by attribute or whole as text;
  an iterator a filter made, which a loop's passes may have advanced): a loop's passes leave
  nothing else behind that later text could depend on (Jinja scopes a loop's variables;
  ``cycler`` and ``joiner``, which could carry state too, keep a template off this path).

For any other prefix the template is rendered on it, as before. The tracked render must give the
very text a plain one gives; the two differ only in time.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from typing import Any

from shardsmith.kit.chat_bounds import TRACKING
from shardsmith.kit.chat_template import ChatError, ChatTemplate, prepared

_STATEFUL = re.compile(r"\b(cycler|joiner)\b")
NOT_TURN_BY_TURN = "the template does not render turn by turn: give it {% generation %} blocks"


class _Loop:
    """One run of a loop over the tracked messages."""

    def __init__(self, *, has_else: bool) -> None:
        self.has_else, self.in_body, self.passes = has_else, False, 0


class Observations:
    """What a template read of its messages, in order, as ``(offset, past, step)``: where in the
    text the render was; the longest prefix the read tells apart from the whole (message i: the
    prefixes of i messages or fewer lack it; a length: all of them; state: none, -1); and,
    for a loop's own step to its next message, ``(the loop's run, passes so far)``. ``exits``:
    where each run of a loop ended, and how many reads came before."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.reads: list[tuple[int, int, tuple[_Loop, int] | None]] = []
        self.exits: dict[int, tuple[int, int]] = {}  # id(run) -> (offset, reads before its end)
        self.active: dict[int, _Loop] = {}  # the run in progress of each instrumented loop
        self.runs: list[_Loop] = []  # every run, kept alive: their ids stay theirs

    @staticmethod
    def _offset() -> int:
        tracking = TRACKING.get()
        return tracking.emitted if tracking is not None else 0

    def read(self, index: int, step: _Loop | None = None) -> None:
        self.reads.append((self._offset(), index, None if step is None else (step, step.passes)))

    def reveal_length(self) -> None:
        self.reads.append((self._offset(), self.total, None))

    def state_read(self) -> None:
        """A read of what a loop's passes can change (a namespace, an iterator made before the
        loop and advanced in it): past no prefix, but a read after a loop ended."""
        self.reads.append((self._offset(), -1, None))

    # the hooks of chat_sandbox's instrumented loops
    def loop_started(self, loop: int, streamed: bool, has_else: bool, iterable: Any) -> Any:
        if not (streamed and isinstance(iterable, Tracked) and iterable._observations is self):
            return iterable
        run = self.active[loop] = _Loop(has_else=has_else)
        self.runs.append(run)
        return iterable._stepped(run)

    def entered(self, loop: int) -> None:
        run = self.active.get(loop)
        if run is not None:
            run.in_body = True
            run.passes += 1

    def left(self, loop: int) -> None:
        run = self.active.get(loop)
        if run is not None:
            run.in_body = False

    def exited(self, loop: int) -> None:
        run = self.active.pop(loop, None)
        if run is not None:
            self.exits[id(run)] = (self._offset(), len(self.reads))


class Tracked(Sequence):
    """The prepared messages ``items[start:]`` as a template reads them, each read told to
    ``observations``. Not a list (C code reading a list's items directly would be unseen): what a
    list can do that this cannot makes the tracked render differ, and then it is not used. Its
    own attributes are underscored: the sandbox keeps a template from them (``messages._items``
    would read a message unseen, ``messages._observations`` would rewrite what was seen)."""

    def __init__(self, items: list[dict], observations: Observations, start: int = 0) -> None:
        self._items, self._observations, self._start = items, observations, start

    def _whole(self) -> list[dict]:
        self._observations.reveal_length()
        return self._items[self._start:]

    def __len__(self) -> int:
        return len(self._whole())

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            if index.step in (None, 1) and index.stop is None and (index.start is None or index.start >= 0):
                return Tracked(self._items, self._observations, self._start + (index.start or 0))
            return self._whole()[index]
        if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            at = self._start + index
            self._observations.read(at)
            if at >= len(self._items):
                raise IndexError("list index out of range")
            return self._items[at]
        return self._whole()[index]

    def __iter__(self) -> Any:
        return self._stepped(None)

    def _stepped(self, loop: _Loop | None) -> Any:
        """The messages one by one, each read told (as ``loop``'s own step when it asks between two passes)."""
        at = self._start
        while True:
            self._observations.read(at, loop if loop is not None and not loop.in_body else None)
            if at >= len(self._items):
                return
            yield self._items[at]
            at += 1

    def __reversed__(self) -> Any:
        return reversed(self._whole())

    def __contains__(self, value: Any) -> bool:
        return value in self._whole()

    def __bool__(self) -> bool:
        self._observations.read(self._start)
        return self._start < len(self._items)

    def __eq__(self, other: Any) -> bool:
        return self._whole() == (list(other) if isinstance(other, Tracked) else other)

    __hash__ = None  # type: ignore[assignment]  # as a list's

    def __add__(self, other: Any) -> Any:
        return self._whole() + other

    def __radd__(self, other: Any) -> Any:
        return other + self._whole()

    def __repr__(self) -> str:
        return repr(self._whole())

    def index(self, *args: Any) -> int:
        return self._whole().index(*args)

    def count(self, value: Any) -> int:
        return self._whole().count(value)


class _Renders:
    """The renders of prefixes of one conversation with one ``add_generation_prompt``, from a
    tracked render of the whole (``lengths``); None for a prefix that needs its own render."""

    def __init__(self, template: ChatTemplate, chat: list[dict], tools: list[dict] | None, *, plain: str,
                 plain_text: str, add_generation_prompt: bool) -> None:
        """``plain``: the whole conversation's plain render with this ``add_generation_prompt`` (the
        tracked one must equal it); ``plain_text``: without the generation prompt (the text a
        prefix's render must begin)."""
        self.text: str | None = None
        observations = Observations(len(chat))
        try:
            tracked, _ = template.render_prepared(Tracked(chat, observations), tools=tools,
                                                  add_generation_prompt=add_generation_prompt, observer=observations)
        except ChatError:
            return
        if tracked != plain:
            return
        self.text, self.observations = tracked, observations
        self.common = len(tracked) if plain is plain_text else _common_prefix(tracked, plain_text)
        reads = observations.reads
        self.reach = []  # the running maximum of how far the reads reached: the first read past k is a search
        top = -1
        for _, past, _ in reads:
            top = max(top, past)
            self.reach.append(top)

    def length(self, k: int) -> int | None:
        """The length of ``render(messages[:k])`` (1 <= k), when certain from the tracked render;
        and with it ``(offset, end of loop)``: the text is ``text[:offset] + text[end:]``."""
        got = self.pieces(k)
        return None if got is None else got[0] + len(self.text) - got[1]

    def pieces(self, k: int) -> tuple[int, int] | None:
        if self.text is None:
            return None
        obs = self.observations
        first = bisect.bisect_left(self.reach, k)
        if first == len(self.reach):
            return len(self.text), len(self.text)  # the template never reads past k: the prefix renders the same
        offset, past, step = obs.reads[first]
        if step is None or past != k:
            return None
        loop, passes = step
        end = obs.exits.get(id(loop))
        if end is None or (loop.has_else and passes == 0):
            return None
        end_offset, reads_before_end = end
        if reads_before_end != len(obs.reads):
            return None  # read after the loop ended: the rest may depend on how far the loop went
        return offset, end_offset


def _common_prefix(a: str, b: str) -> int:
    """How many first characters ``a`` and ``b`` share (by bisection: each step one C comparison)."""
    low, high = 0, min(len(a), len(b))
    if a[:high] == b[:high]:
        return high
    while high - low > 1:  # a[:low] == b[:low], a[:high] != b[:high]
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low


def prefix_length(template: ChatTemplate, messages: list[dict], tools: list[dict] | None, text: str, *,
                  add_generation_prompt: bool, chat: list[dict] | None = None) -> int:
    """The length of the text ``messages`` render to, which must begin the whole conversation's
    (``chat``: the whole conversation's messages already prepared, of which ``messages`` are the first)."""
    try:
        if chat is None:
            part, _ = template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                      allow_empty=True)
        else:
            part, _ = template.render_prepared(chat[:len(messages)], tools=tools,
                                               add_generation_prompt=add_generation_prompt)
    except ChatError as exc:
        if messages:
            raise
        part, why = None, f" ({exc})"
    else:
        why = ""
    if part is None or not text.startswith(part):
        if not messages:  # rendering no messages is not something templates are written for
            raise ChatError("the template does not render what comes before an assistant that speaks first"
                            f"{why}: start with a user message, or give the template {{% generation %}} blocks")
        raise ChatError(NOT_TURN_BY_TURN)
    return len(part)


def turn_spans(template: ChatTemplate, messages: list[dict], tools: list[dict] | None,
               text: str) -> list[tuple[int, int]]:
    """For each assistant message k, (end of ``render(messages[:k], add_generation_prompt=True)``,
    end of ``render(messages[:k+1])``), both of which must begin ``text`` (the whole render)."""
    turns = [k for k, m in enumerate(messages) if m.get("role") == "assistant"]
    n = len(messages)
    # one tracked render per add_generation_prompt (and a plain one to compare with) costs about 3n
    # messages rendered; rendering each prefix costs the sum of their lengths
    one_by_one = sum(2 * k + 1 for k in turns)
    fast = one_by_one > 4 * n + 16 and not any(_STATEFUL.search(src) for src in template.sources.values())
    renders: dict[bool, _Renders | None] = {False: None, True: None}
    chat = prepared(messages)
    if fast:
        plain_with_prompt, _ = template.render_prepared(chat, tools=tools, add_generation_prompt=True)
        renders = {False: _Renders(template, chat, tools, plain=text, plain_text=text, add_generation_prompt=False),
                   True: _Renders(template, chat, tools, plain=plain_with_prompt, plain_text=text,
                                  add_generation_prompt=True)}

    def length(k: int, prompt: bool) -> int:
        if k == n and not prompt:  # the whole conversation: its render is the text
            return len(text)
        known = renders[prompt]
        pieces = known.pieces(k) if known is not None and k > 0 else None
        if pieces is None:
            return prefix_length(template, messages[:k], tools, text, add_generation_prompt=prompt, chat=chat)
        offset, end = pieces
        tail = known.text[end:]
        if offset > known.common or text[offset:offset + len(tail)] != tail:  # not a prefix of the whole text
            raise ChatError(NOT_TURN_BY_TURN)
        return offset + len(tail)

    spans = []
    for k in turns:
        start, end = length(k, True), length(k + 1, False)
        if end < start:
            raise ChatError(NOT_TURN_BY_TURN)
        spans.append((start, end))
    return spans

