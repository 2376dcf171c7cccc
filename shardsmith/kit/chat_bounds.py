"""The bounds a chat template renders under (``kit/chat_sandbox.py`` builds the environment that
applies them): a ``Budget`` of steps for all renders of a conversation and of characters made for
each render, counted and never timed, so the same template and conversation stop at the same step on
any machine; and, for each operation that can make a value much larger than its operands (string and
list repetition, ``+``, ``~``, ``**``, ``%``, ``format``, ``center``, ``indent``, ``join``,
``replace``...), a check of the size it would make, before it makes it. Reaching a bound is
``TemplateLimit``, one line.

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
from collections.abc import Iterator
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
# filters that read no more of their value than its length, or read it lazily item by item (each item
# then a step of its own: the filter or test they call on it)
SHALLOW_FILTERS = frozenset(("abs", "attr", "batch", "count", "d", "default", "first", "items", "last", "length",
                             "list", "map", "random", "reject", "rejectattr", "reverse", "round", "select",
                             "selectattr", "slice"))
# filters that work on their text word by word, in Python (a step a character) or in regular
# expressions (a step for so many characters)
TEXT_FILTERS = {"title": 1, "urlencode": 1, "urlize": 1, "wordwrap": 1, "striptags": 32, "wordcount": 32}
# tests that read their values (the others look at a type or a number)
READING_TESTS = frozenset(("!=", "<", "<=", "==", ">", ">=", "eq", "equalto", "ge", "greaterthan", "gt", "in",
                           "le", "lessthan", "lower", "lt", "ne", "upper"))
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


def _walk(value: Any) -> int:
    from jinja2.utils import Namespace

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


def _items(n: int, what: str) -> None:
    if n > MAX_ITEMS:
        raise TemplateLimit(f"would make {what} of {n:,} items, more than {MAX_ITEMS:,}")


def _width(n: Any, what: str) -> None:
    if isinstance(n, int) and n > MAX_VALUE_CHARS:
        raise TemplateLimit(f"asks {what} of {n:,}, more than {MAX_VALUE_CHARS:,}")


def _sized(value: Any) -> int | None:
    """How long a string, list or tuple is (None for anything else)."""
    return len(value) if isinstance(value, (str, list, tuple)) else None


def check_repeat(seq: Any, times: Any) -> None:
    """``seq * times`` (either order) makes at most the bounded size."""
    if isinstance(seq, int) and not isinstance(times, int):
        seq, times = times, seq
    size = _sized(seq)
    if size is not None and isinstance(times, int) and times > 0:
        (check_chars if isinstance(seq, str) else _items)(size * times, "a repetition")


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
                _width(int(part), "a %-format width")
    if stars:
        for value in args if isinstance(args, (tuple, list)) else (args,):
            _width(value, "a %-format width")
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
            _width(int(number), "a format width")
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
        a, b = _sized(left), _sized(right)
        if operator == "+" and a is not None and b is not None:
            (check_chars if isinstance(left, str) else _items)(a + b, "a concatenation")
    elif operator == "%":
        check_percent(left, right)


# ---------------------------------------------------------------------------------------------
# filters and methods whose result can be far larger than their operands: each checks first


def _skip(func: Any) -> int:
    """How many leading arguments Jinja passes a filter before its value (context, environment)."""
    return 1 if getattr(func, "jinja_pass_arg", None) is not None else 0


def materialized(value: Any) -> list:
    items = list(value)
    _items(len(items), "a list")
    return made(items)


def _check_filter(name: str, args: tuple, kwargs: dict) -> tuple:
    """The filter's arguments (its value first), checked; an iterable it would read twice made a list."""

    def arg(i: int, key: str, default: Any = None) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name == "center":
        _width(arg(1, "width", 80), "a width")
    elif name == "indent":  # Jinja's do_indent: the first line and blank lines are left alone unless asked
        width, text = arg(1, "width", 4), str(arg(0, "s", ""))
        first, blank = arg(2, "first", False), arg(3, "blank", False)
        if isinstance(width, int) and not isinstance(width, bool):
            _width(width, "an indent")
        lines = (text + "\n").splitlines()
        indented = (len(lines) - 1 if blank else sum(1 for line in lines[1:] if line)) + (1 if first else 0)
        if isinstance(width, (int, str)):
            check_chars(len(text) + (len(width) if isinstance(width, str) else width) * indented, "an indented text")
    elif name == "wordwrap":  # a wrap string at most once a word, or a width, or a line
        text, width, wrap = str(arg(0, "s", "")), arg(1, "width", 79), arg(4, "wrapstring") or "\n"
        breaks = len(text.split()) + text.count("\n") + 1 + len(text) // max(width if isinstance(width, int) else 1, 1)
        check_chars(len(text) + len(str(wrap)) * breaks, "a wrapped text")
    elif name == "format":
        check_percent(str(args[0]) if args else "", kwargs or tuple(args[1:]))
    elif name == "replace":
        text, old, new, count = str(arg(0, "s", "")), str(arg(1, "old", "")), str(arg(2, "new", "")), arg(3, "count")
        found = text.count(old) if old else len(text) + 1
        if isinstance(count, int) and count >= 0:
            found = min(found, count)
        check_chars(len(text) + found * max(0, len(new) - len(old)), "a replaced text")
    elif name == "slice":  # makes its number of lists, filled or not
        count = arg(1, "slices", 0)
        if isinstance(count, int):
            _items(count, "a slice")
    elif name == "batch" and arg(2, "fill_with") is not None:  # the last batch filled to its length
        count = arg(1, "linecount", 0)
        if isinstance(count, int):
            _items(count, "a batch")
    elif name == "join" and args:
        items = materialized(args[0])
        attribute, sep = arg(2, "attribute"), str(arg(1, "d", ""))
        values = items if attribute is None else [_plain_attribute(x, attribute) for x in items]
        check_chars(sum(len(str(x)) for x in values) + len(sep) * max(0, len(items) - 1), "a joined text")
        args = (items, *args[1:])
    elif name == "sum" and args:
        items = materialized(args[0])
        start = arg(2, "start", 0)
        if _sized(start) is not None:
            sizes = [_sized(x) or 0 for x in items]
            total = len(start) + sum(sizes)
            (check_chars if isinstance(start, str) else _items)(total, "a sum")
            if total * len(items) // 2 > 64 * MAX_ITEMS:  # each term copies all that came before it
                raise TemplateLimit(f"would copy {total * len(items) // 2:,} items summing {len(items):,} terms")
        args = (items, *args[1:])
    elif name == "tojson":
        indent = arg(2, "indent")
        if (isinstance(indent, int) and indent > MAX_INDENT) or (isinstance(indent, str) and len(indent) > MAX_INDENT):
            raise TemplateLimit(f"asks tojson for an indent over {MAX_INDENT}")
        width = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else None
        if width is not None and args:  # each item on a line of its own, indented as deep as it lies
            items, deepest = _nesting(args[0])
            check_chars(items * (2 + deepest * max(width, 0)), "an indented JSON text")
    return args


def _nesting(value: Any) -> tuple[int, int]:
    """(items, the deepest level) of the lists and dicts in ``value``: walked only after ``read``
    paid for a walk of it."""
    items, deepest, stack = 0, 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, tuple, dict)):
            items += len(node)
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return items, deepest


def _plain_attribute(value: Any, attribute: Any) -> Any:
    """``attribute`` (dotted, or an index) of plain data, as ``make_attrgetter`` finds it there."""
    for part in str(attribute).split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, (list, tuple, str)) and part.lstrip("-").isdigit():
            index = int(part)
            value = value[index] if -len(value) <= index < len(value) else None
        else:
            return ""
    return "" if value is None else value


def bounded_filter(name: str, func: Any) -> Any:
    skip = _skip(func)
    reads, per_step = name not in SHALLOW_FILTERS, TEXT_FILTERS.get(name)

    @functools.wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        tick()
        if reads:  # the value read whole (and its text no longer than a value may be), and the arguments
            size = read_text(args[skip], f"the value of |{name}") if len(args) > skip else 0
            for value in (*args[skip + 1:], *kwargs.values()):
                read(value)
            if per_step:
                tick(size // per_step)
        args = (*args[:skip], *_check_filter(name, tuple(args[skip:]), kwargs))
        value = made(func(*args, **kwargs))
        return _stepped(value, OBSERVER.get()) if isinstance(value, Iterator) else value

    return bounded


def _stepped(items: Iterator, observer: Any) -> Iterator:
    """An iterator a filter made (``map``, ``select``, ``batch``...): each item a step (an
    attribute looked up for it through the sandbox, a test...), and each advance told to the
    render's observer as a read of state (one made before a loop and advanced in its passes holds
    how far the loop went: ``chat_turns``)."""
    while True:
        if observer is not None:
            observer.state_read()
        try:
            item = next(items)
        except StopIteration:
            return
        tick()
        yield item


def bounded_test(name: str, func: Any) -> Any:
    reads = name in READING_TESTS

    @functools.wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        tick()
        if reads:
            for value in (*args, *kwargs.values()):
                read(value)
        return func(*args, **kwargs)

    return bounded


def check_method(obj: Any, args: tuple, kwargs: dict) -> tuple:
    """A call of a string's (or an int's) method that makes a larger value, checked; a ``join``'s
    iterable made a list (read once for its size, once to join); a string's, list's or dict's
    method reads it (``count``, ``find``, ``index``, ``split``...)."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if type(owner) in (str, list, tuple, dict):
        read(owner)
    if isinstance(owner, str):
        if name in ("center", "ljust", "rjust", "zfill") and args:
            _width(args[0], f"str.{name} a width")
        elif name == "expandtabs":
            size = args[0] if args else kwargs.get("tabsize", 8)
            if isinstance(size, int):
                check_chars(len(owner) + owner.count("\t") * max(size - 1, 0), "an expanded text")
        elif name == "replace" and len(args) >= 2:
            found = owner.count(str(args[0])) if args[0] else len(owner) + 1
            if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
                found = min(found, args[2])
            check_chars(len(owner) + found * max(0, len(str(args[1])) - len(str(args[0]))), "a replaced text")
        elif name == "join" and args:
            items = materialized(args[0])
            check_chars(sum(len(x) if isinstance(x, str) else 0 for x in items) + len(owner) * max(0, len(items) - 1),
                   "a joined text")
            args = (items, *args[1:])
    elif isinstance(owner, int) and name == "to_bytes":
        _width(args[0] if args else kwargs.get("length", 1), "int.to_bytes a length")
    return args


def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 - Jinja's names
    from jinja2.utils import generate_lorem_ipsum

    if isinstance(n, int) and isinstance(max, int):
        check_chars(n * max * 16, "a lorem ipsum")
    return generate_lorem_ipsum(n=n, html=html, min=min, max=max)


# ---------------------------------------------------------------------------------------------
