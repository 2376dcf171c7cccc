"""The bounds a chat template renders under (``text/chat_sandbox.py`` builds the environment that
applies them): a ``Budget`` of steps for all renders of a conversation and of characters made for
each render, counted and never timed, so the same template and conversation stop at the same step on
any machine; and, for each operation that can make a value much larger than its operands (string and
list repetition, ``+``, ``~``, ``**``, ``%``, ``format``, ``center``, ``indent``, ``join``,
``replace``...), a check of the size it would make, before it makes it (the operators' checks here,
the filters' and methods' in ``text/chat_filters.py``). Reaching a bound is ``TemplateLimit``, one
line.

Steps bound the time of all of a conversation's renders only if no step can do unbounded work, so
work on characters is steps too: every ``CHARS_PER_STEP`` characters made, and every
``CHARS_PER_STEP`` characters an operation reads (``read``: a comparison, a filter, a method, a
value written out), and each item of each list, dict or namespace it reads, is a step. A value that
holds another many times over (``[x, x]`` doubled sixty times: 2**60 items to print, compare or
hash, from 120 steps) is read no further than the steps left.
"""

from __future__ import annotations

import functools
import re
import string
from contextvars import ContextVar
from typing import Any

MAX_VALUE_CHARS = 32 << 20  # the longest string an operation may make
MAX_ITEMS = 1 << 20  # the longest list an operation may make
MAX_INT_BITS = 1 << 16  # the largest integer (transformers' str() of an int stops at 4,300 digits anyway)
MAX_INDENT = 64  # tojson's indent
MAX_TEMPLATE_TOKENS = 100_000  # a template's tokens (published ones have a few thousand; compiling takes ~2 KB each)
# characters (or items) read or made that count as one step: C copies, scans, splits or matches a
# kilobyte in about the time Python takes for a few steps (a loop's pass), so the steps bound a
# conversation's time whatever its operations touch
CHARS_PER_STEP = 1024
_NUMBERS = re.compile(r"\d+")
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


class TemplateLimit(Exception):
    """A render reached one of its bounds (its message says which)."""


class Budget:
    """What is left: ``steps`` to the renders of one conversation, ``chars`` (characters and items
    made) to the render in progress (``ChatTemplate.render_prepared`` resets it to ``given[1]``)."""

    def __init__(self, *, steps: int, chars: int) -> None:
        self.steps, self.chars = steps, chars
        self.given = (steps, chars)

    def tick(self, n: int = 1) -> None:
        self.steps -= n
        if self.steps < 0:
            raise TemplateLimit(f"took more than {self.given[0]:,} steps for this conversation (a loop that never "
                                f"ends? a long conversation rendered turn by turn: give the template {{% generation %}} "
                                f"blocks)")

    def charge(self, chars: int) -> None:
        self.chars -= chars
        if self.chars < 0:
            raise TemplateLimit(f"made more than {self.given[1]:,} characters (and items) in one render")
        if chars >= CHARS_PER_STEP:
            self.tick(chars // CHARS_PER_STEP)


BUDGET: ContextVar[Budget | None] = ContextVar("shardsmith_chat_budget", default=None)
OBSERVER: ContextVar[Any] = ContextVar("shardsmith_chat_observer", default=None)


class Tracking:
    """Characters yielded so far by the render in progress, and the generation spans it closed."""

    def __init__(self) -> None:
        self.emitted, self.spans = 0, []


TRACKING: ContextVar[Tracking | None] = ContextVar("shardsmith_chat_generation", default=None)


def tick(n: int = 1) -> None:
    budget = BUDGET.get()
    if budget is not None:
        budget.tick(n)


def made(value: Any) -> Any:
    """``value``, a string or list (or bytes: ``str.encode``; or Markup: ``|safe``, ``|e``) an
    operation made, charged to the render's characters (what a render allocates stays bounded, not
    only what it keeps)."""
    if isinstance(value, (str, list, tuple, bytes)):
        budget = BUDGET.get()
        if budget is not None:
            budget.charge(len(value))
    return value


def read(value: Any) -> int:
    """How long ``value`` is as text (its characters, and a few for each item and number inside
    it), its reading charged first as steps (``CHARS_PER_STEP`` characters, or an item, a step).
    Walked without recursion and no further than the steps left: a structure that holds itself
    many times over is a ``TemplateLimit``, not a walk for ever."""
    kind = type(value)
    if kind is str:
        if len(value) >= CHARS_PER_STEP:
            tick(len(value) // CHARS_PER_STEP)
        return len(value)
    if kind is int:
        return value.bit_length() // 3 + 1
    if kind in (float, bool, type(None)):
        return 24
    return _walk(value)


def seen(value: Any) -> Any:
    """``value``, its reading charged (``read``): what an operand of a comparison goes through."""
    if type(value) is not str or len(value) >= CHARS_PER_STEP:
        read(value)
    return value


def read_text(value: Any, what: str) -> int:
    """``read``, and the text ``value`` would make checked against the longest an operation may make."""
    size = read(value)
    if size > MAX_VALUE_CHARS:
        raise TemplateLimit(f"would read {what} of {size:,} characters as text, more than {MAX_VALUE_CHARS:,}")
    return size


_VIEWS = (range, type({}.keys()), type({}.values()), type({}.items()))


@functools.cache
def _namespace_type() -> type:
    from jinja2.utils import Namespace

    return Namespace


def _walk(value: Any) -> int:
    Namespace = _namespace_type()  # noqa: N806
    budget = BUDGET.get()
    left = budget.steps if budget is not None else MAX_VALUE_CHARS
    size, steps, stack = 0, 0, [value]
    while stack and steps + size // CHARS_PER_STEP <= left:
        node = stack.pop()
        if isinstance(node, str):
            size += len(node) + 2
            continue
        steps += 1
        if isinstance(node, (list, tuple)):
            steps += len(node)
            size += 2 + 2 * len(node)
            if steps <= left:
                stack.extend(node)
        elif isinstance(node, dict):
            steps += 2 * len(node)
            size += 2 + 4 * len(node)
            if steps <= left:
                stack.extend(node.keys())
                stack.extend(node.values())
        elif isinstance(node, _VIEWS):  # (a range's numbers are read, not walked)
            steps += len(node)
            size += 2 + 8 * len(node)
            if steps <= left and not isinstance(node, range):
                stack.extend(node)
        elif isinstance(node, Namespace):
            size += 14
            stack.append(object.__getattribute__(node, "_Namespace__attrs"))
        elif isinstance(node, int):
            size += node.bit_length() // 3 + 1
        else:
            size += 24
    cost = steps + size // CHARS_PER_STEP
    if budget is not None:
        budget.tick(cost)
    elif cost > left:
        raise TemplateLimit(f"would read a value of more than {left:,} items")
    return size


def check_chars(n: int, what: str) -> None:
    if n > MAX_VALUE_CHARS:
        raise TemplateLimit(f"would make {what} of {n:,} characters, more than {MAX_VALUE_CHARS:,}")


def check_items(n: int, what: str) -> None:
    if n > MAX_ITEMS:
        raise TemplateLimit(f"would make {what} of {n:,} items, more than {MAX_ITEMS:,}")


def check_width(n: Any, what: str) -> None:
    if isinstance(n, int) and n > MAX_VALUE_CHARS:
        raise TemplateLimit(f"asks {what} of {n:,}, more than {MAX_VALUE_CHARS:,}")


def sized(value: Any) -> int | None:
    """How long a string, list or tuple is (None for anything else)."""
    return len(value) if isinstance(value, (str, list, tuple)) else None


def check_repeat(seq: Any, times: Any) -> None:
    """``seq * times`` (either order) makes at most the bounded size."""
    if isinstance(seq, int) and not isinstance(times, int):
        seq, times = times, seq
    size = sized(seq)
    if size is not None and isinstance(times, int) and times > 0:
        (check_chars if isinstance(seq, str) else check_items)(size * times, "a repetition")


def check_percent(fmt: Any, args: Any) -> None:
    """``fmt % args`` asks no width or precision past the bound (``*`` ones read from ``args``), and
    makes no more than the bound with its values (``%(a)s`` a thousand times over one long ``a``)."""
    if not isinstance(fmt, str):
        return
    stars, specs = False, 0
    for spec in _PERCENT_SPEC.finditer(fmt):
        specs += 1
        for part in spec.groups():
            if part == "*":
                stars = True
            elif part:
                check_width(int(part), "a %-format width")
    if stars:
        for value in args if isinstance(args, (tuple, list)) else (args,):
            check_width(value, "a %-format width")
    values = args if isinstance(args, tuple) else (args,)  # (a dict whole: ``%(a)s`` or ``%s`` of it)
    check_chars(len(fmt) + specs * max((read_text(v, "a value to %-format") for v in values), default=0),
                "a %-formatted text")


def check_format(fmt: str, args: tuple = (), kwargs: dict | None = None) -> None:
    """``fmt.format(*args, **kwargs)`` asks no width or precision past the bound, and none from an
    argument, and makes no more than the bound with its values (``{0}`` a thousand times over)."""
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # format() itself says what is wrong
    for _, _, spec, _ in fields:
        if not spec:
            continue
        if "{" in spec:
            raise TemplateLimit("would format with a width taken from an argument, which chat templates may not")
        for number in _NUMBERS.findall(spec):
            check_width(int(number), "a format width")
    values = (*args, *(kwargs or {}).values())
    largest = max((read_text(v, "a value to format") for v in values), default=0)
    check_chars(len(fmt) + sum(1 for f in fields if f[1] is not None) * largest, "a formatted text")


def check_binop(operator: str, left: Any, right: Any) -> None:
    if operator == "*":
        if isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise TemplateLimit(f"would multiply integers past {MAX_INT_BITS:,} bits")
        else:
            check_repeat(left, right)
    elif operator == "**":
        if (isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1
                and left.bit_length() * right > MAX_INT_BITS):
            raise TemplateLimit(f"would raise an integer past {MAX_INT_BITS:,} bits")
    elif operator in ("+", "-"):
        if isinstance(left, int) and isinstance(right, int):  # (n + n, or n - -n, doubles each step)
            if max(left.bit_length(), right.bit_length()) >= MAX_INT_BITS:
                raise TemplateLimit(f"would add integers past {MAX_INT_BITS:,} bits")
            return
        a, b = sized(left), sized(right)
        if operator == "+" and a is not None and b is not None:
            (check_chars if isinstance(left, str) else check_items)(a + b, "a concatenation")
    elif operator == "%":
        check_percent(left, right)
