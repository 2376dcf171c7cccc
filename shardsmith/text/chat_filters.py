"""The filters, tests and methods a chat template calls, bounded (``text/chat_bounds.py`` holds the
bounds): each is a step and reads its value and arguments as ``read`` charges them; those whose
result can be far larger than their operands (``center``, ``indent``, ``wordwrap``, ``format``,
``replace``, ``slice``, ``batch``, ``join``, ``sum``, ``tojson``, ``str.ljust``, ``int.to_bytes``,
``lipsum``...) check the size they would make before they make it; the lazy ones (``map``,
``select``, ``reject``...) are a step for each item they take, yielded or not, and an attribute path
(``sort(attribute=)``, ``groupby``, ``selectattr``) is steps an item. ``text/chat_sandbox.py``
installs them in the environment.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from shardsmith.text.chat_bounds import (
    BUDGET,
    MAX_INDENT,
    MAX_ITEMS,
    OBSERVER,
    TemplateLimit,
    check_chars,
    check_items,
    check_percent,
    check_width,
    made,
    read,
    read_text,
    sized,
    tick,
)

# filters that read no more of their value than its length, or read it lazily item by item (each item
# then a step of its own: the filter or test they call on it)
SHALLOW_FILTERS = frozenset(("abs", "attr", "batch", "count", "d", "default", "first", "items", "last", "length",
                             "list", "map", "random", "reject", "rejectattr", "reverse", "round", "select",
                             "selectattr", "slice"))
# filters that go through their value item by item, lazily: each item taken is a step (a rejected
# one too: ``rejectattr('real')`` over a range yields nothing and looks at every item)
LAZY_FILTERS = frozenset(("map", "reject", "rejectattr", "select", "selectattr"))
# an attribute path (``sort(attribute='a.b')``, ``groupby``, ``selectattr``, ``map(attribute=)``...)
# costs each item this many steps a part: a lookup through the sandbox takes ~5 times a loop's pass
ATTRIBUTE_STEPS = 4
# groupby does more for each item: keyed twice, sorted, grouped, a group tuple made (~24 passes' time)
GROUPBY_STEPS = 12
# filters that work on their text word by word, in Python (a step a character) or in regular
# expressions (a step for so many characters)
TEXT_FILTERS = {"title": 1, "urlencode": 1, "urlize": 1, "wordwrap": 1, "striptags": 32, "wordcount": 32}
# tests that read their values (the others look at a type or a number)
READING_TESTS = frozenset(("!=", "<", "<=", "==", ">", ">=", "eq", "equalto", "ge", "greaterthan", "gt", "in",
                           "le", "lessthan", "lower", "lt", "ne", "upper"))




def _skip(func: Any) -> int:
    """How many leading arguments Jinja passes a filter before its value (context, environment)."""
    return 1 if getattr(func, "jinja_pass_arg", None) is not None else 0


def materialized(value: Any) -> list:
    items = list(value)
    check_items(len(items), "a list")
    return made(items)


def _check_filter(name: str, args: tuple, kwargs: dict) -> tuple:
    """The filter's arguments (its value first), checked; an iterable it would read twice made a list."""

    def arg(i: int, key: str, default: Any = None) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name == "center":
        check_width(arg(1, "width", 80), "a width")
    elif name == "indent":  # Jinja's do_indent: the first line and blank lines are left alone unless asked
        width, text = arg(1, "width", 4), str(arg(0, "s", ""))
        first, blank = arg(2, "first", False), arg(3, "blank", False)
        if isinstance(width, int) and not isinstance(width, bool):
            check_width(width, "an indent")
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
            check_items(count, "a slice")
    elif name == "batch" and arg(2, "fill_with") is not None:  # the last batch filled to its length
        count = arg(1, "linecount", 0)
        if isinstance(count, int):
            check_items(count, "a batch")
    elif name == "join" and args:
        items = materialized(args[0])
        attribute, sep = arg(2, "attribute"), str(arg(1, "d", ""))
        values = items if attribute is None else [_plain_attribute(x, attribute) for x in items]
        check_chars(sum(len(str(x)) for x in values) + len(sep) * max(0, len(items) - 1), "a joined text")
        args = (items, *args[1:])
    elif name == "sum" and args:
        items = materialized(args[0])
        start = arg(2, "start", 0)
        if sized(start) is not None:
            sizes = [sized(x) or 0 for x in items]
            total = len(start) + sum(sizes)
            (check_chars if isinstance(start, str) else check_items)(total, "a sum")
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


def _attribute_at(name: str, func: Any, skip: int) -> int | None:
    """Where among a filter's arguments its attribute path is passed (None: by keyword only, or not at all)."""
    if name in ("selectattr", "rejectattr"):
        return skip + 1
    import inspect

    try:
        names = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("attribute") if "attribute" in names else None


def _per_item(name: str, attribute: Any) -> int:
    """The steps a filter's looking up ``attribute`` on each item costs beyond the item's own."""
    if attribute is None:
        return GROUPBY_STEPS if name == "groupby" else 0
    parts = str(attribute).count(".") + 1 if isinstance(attribute, str) else 1
    return ATTRIBUTE_STEPS * parts * 2 + GROUPBY_STEPS if name == "groupby" else ATTRIBUTE_STEPS * parts


def bounded_filter(name: str, func: Any) -> Any:
    skip = _skip(func)
    reads, per_step = name not in SHALLOW_FILTERS, TEXT_FILTERS.get(name)
    lazy, attribute_at = name in LAZY_FILTERS, _attribute_at(name, func, skip)

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
        if len(args) > skip:
            attribute = (args[attribute_at] if attribute_at is not None and len(args) > attribute_at
                         else kwargs.get("attribute"))
            extra = _per_item(name, attribute)
            if lazy:  # each item it takes a step (and its lookups), whether it yields it or not
                args = (*args[:skip], _taken(args[skip], 1 + extra), *args[skip + 1:])
            elif extra:  # it looks up every item at once: paid for first
                items = args[skip] if hasattr(args[skip], "__len__") else materialized(args[skip])
                tick(len(items) * extra)
                args = (*args[:skip], items, *args[skip + 1:])
        value = made(func(*args, **kwargs))
        return _stepped(value, OBSERVER.get(), 0 if lazy else 1) if isinstance(value, Iterator) else value

    return bounded


def _taken(items: Any, steps: int) -> Iterator:
    """The items of a lazy filter's value, ``steps`` steps each as the filter takes it."""
    budget = BUDGET.get()
    for item in items:
        if budget is not None:
            budget.tick(steps)
        yield item


def _stepped(items: Iterator, observer: Any, steps: int) -> Iterator:
    """An iterator a filter made (``map``, ``select``, ``batch``...): each item ``steps`` steps
    (those of ``LAZY_FILTERS`` count the items they take instead: ``_taken``), and each advance
    told to the render's observer as a read of state (one made before a loop and advanced in its
    passes holds how far the loop went: ``chat_turns``)."""
    while True:
        if observer is not None:
            observer.state_read()
        try:
            item = next(items)
        except StopIteration:
            return
        if steps:
            tick(steps)
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
            check_width(args[0], f"str.{name} a width")
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
        check_width(args[0] if args else kwargs.get("length", 1), "int.to_bytes a length")
    return args


def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 - Jinja's names
    from jinja2.utils import generate_lorem_ipsum

    if isinstance(n, int) and isinstance(max, int):
        check_chars(n * max * 16, "a lorem ipsum")
    return generate_lorem_ipsum(n=n, html=html, min=min, max=max)
