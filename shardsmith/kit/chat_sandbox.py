"""The sandboxed Jinja2 environment chat templates render in: transformers' own (``trim_blocks``,
``lstrip_blocks``, loop controls, ``{% generation %}``, ``raise_exception``, ``strftime_now``, a
``tojson`` that escapes no HTML, ``dict`` and a ``namespace`` without the way to CPython internals),
with bounds a crafted template cannot pass.

A template from the Hub is code: ``{{ 'x' * 10**9 }}`` allocates a gigabyte (at compile time, as
Jinja folds constants), nested ``range(100000)`` loops never end, 2,000 nested blocks overflow
the parser's stack. Here every render runs under a ``Budget``: steps (a loop's item, a call, a
filter, an operator) for all renders of a conversation, and characters made (the strings and
lists operations return, the text produced) for each render; counted, never timed, so the same
template and conversation stop at the same step on any machine. Each operation that can make a
value much larger than its operands (string and list repetition, ``+``, ``~``, ``**``, ``%``,
``format``, ``center``, ``indent``, ``join``, ``replace``...) checks the size it would make
first. Reaching a bound is ``TemplateLimit``, one line (``chat_template.py`` makes it the
conversation's ``ChatError``). Operators stay unfolded at compile time, so compiling allocates
nothing.

The loops are instrumented (``Steps``): each item and each pass through a body is a step, and a
pass's constant text is charged as produced; an observer set for a render (``OBSERVER``:
``chat_turns.Observations``) also hears where loops start, pass and end, and namespace reads:
what the turn-by-turn rule needs to find every prefix's render in one.
"""

from __future__ import annotations

import functools
import json
import re
import string
from contextvars import ContextVar
from datetime import datetime
from typing import Any

MAX_VALUE_CHARS = 32 << 20  # the longest string an operation may make
MAX_ITEMS = 1 << 20  # the longest list an operation may make
MAX_INT_BITS = 1 << 16  # the largest integer (transformers' str() of an int stops at 4,300 digits anyway)
MAX_INDENT = 64  # tojson's indent
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


BUDGET: ContextVar[Budget | None] = ContextVar("shardsmith_chat_budget", default=None)
OBSERVER: ContextVar[Any] = ContextVar("shardsmith_chat_observer", default=None)


class Tracking:
    """Characters yielded so far by the render in progress, and the generation spans it closed."""

    def __init__(self) -> None:
        self.emitted, self.spans = 0, []


TRACKING: ContextVar[Tracking | None] = ContextVar("shardsmith_chat_generation", default=None)


def _tick(n: int = 1) -> None:
    budget = BUDGET.get()
    if budget is not None:
        budget.tick(n)


def _made(value: Any) -> Any:
    """``value``, a string or list an operation made, charged to the render's characters (what a
    render allocates stays bounded, not only what it keeps)."""
    if type(value) in (str, list, tuple):
        budget = BUDGET.get()
        if budget is not None:
            budget.charge(len(value))
    return value


def _chars(n: int, what: str) -> None:
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
        (_chars if isinstance(seq, str) else _items)(size * times, "a repetition")


def check_percent(fmt: Any, args: Any) -> None:
    """``fmt % args`` asks no width or precision past the bound (``*`` ones read from ``args``)."""
    if not isinstance(fmt, str):
        return
    stars = False
    for spec in _PERCENT_SPEC.finditer(fmt):
        for part in spec.groups():
            if part == "*":
                stars = True
            elif part:
                _width(int(part), "a %-format width")
    if stars:
        for value in args if isinstance(args, (tuple, list)) else (args,):
            _width(value, "a %-format width")


def check_format(fmt: str) -> None:
    """``fmt.format(...)`` asks no width or precision past the bound, and none from an argument."""
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


def _check_binop(operator: str, left: Any, right: Any) -> None:
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
    elif operator == "+":
        a, b = _sized(left), _sized(right)
        if a is not None and b is not None:
            (_chars if isinstance(left, str) else _items)(a + b, "a concatenation")
    elif operator == "%":
        check_percent(left, right)


# ---------------------------------------------------------------------------------------------
# filters and methods whose result can be far larger than their operands: each checks first


def _skip(func: Any) -> int:
    """How many leading arguments Jinja passes a filter before its value (context, environment)."""
    return 1 if getattr(func, "jinja_pass_arg", None) is not None else 0


def _materialized(value: Any) -> list:
    items = list(value)
    _items(len(items), "a list")
    return items


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
            _chars(len(text) + (len(width) if isinstance(width, str) else width) * indented, "an indented text")
    elif name == "wordwrap":  # a wrap string at most once a word, or a width, or a line
        text, width, wrap = str(arg(0, "s", "")), arg(1, "width", 79), arg(4, "wrapstring") or "\n"
        breaks = len(text.split()) + text.count("\n") + 1 + len(text) // max(width if isinstance(width, int) else 1, 1)
        _chars(len(text) + len(str(wrap)) * breaks, "a wrapped text")
    elif name == "format":
        check_percent(str(args[0]) if args else "", kwargs or tuple(args[1:]))
    elif name == "replace":
        text, old, new, count = str(arg(0, "s", "")), str(arg(1, "old", "")), str(arg(2, "new", "")), arg(3, "count")
        found = text.count(old) if old else len(text) + 1
        if isinstance(count, int) and count >= 0:
            found = min(found, count)
        _chars(len(text) + found * max(0, len(new) - len(old)), "a replaced text")
    elif name == "slice":  # makes its number of lists, filled or not
        count = arg(1, "slices", 0)
        if isinstance(count, int):
            _items(count, "a slice")
    elif name == "batch" and arg(2, "fill_with") is not None:  # the last batch filled to its length
        count = arg(1, "linecount", 0)
        if isinstance(count, int):
            _items(count, "a batch")
    elif name == "join" and args:
        items = _materialized(args[0])
        attribute, sep = arg(2, "attribute"), str(arg(1, "d", ""))
        values = items if attribute is None else [_plain_attribute(x, attribute) for x in items]
        _chars(sum(len(str(x)) for x in values) + len(sep) * max(0, len(items) - 1), "a joined text")
        args = (items, *args[1:])
    elif name == "sum" and args:
        items = _materialized(args[0])
        start = arg(2, "start", 0)
        if _sized(start) is not None:
            sizes = [_sized(x) or 0 for x in items]
            total = len(start) + sum(sizes)
            (_chars if isinstance(start, str) else _items)(total, "a sum")
            if total * len(items) // 2 > 64 * MAX_ITEMS:  # each term copies all that came before it
                raise TemplateLimit(f"would copy {total * len(items) // 2:,} items summing {len(items):,} terms")
        args = (items, *args[1:])
    elif name == "tojson":
        indent = arg(2, "indent")
        if (isinstance(indent, int) and indent > MAX_INDENT) or (isinstance(indent, str) and len(indent) > MAX_INDENT):
            raise TemplateLimit(f"asks tojson for an indent over {MAX_INDENT}")
    return args


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


def _bounded_filter(name: str, func: Any) -> Any:
    skip = _skip(func)

    @functools.wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        args = (*args[:skip], *_check_filter(name, tuple(args[skip:]), kwargs))
        return _made(func(*args, **kwargs))

    return bounded


def _bounded_test(func: Any) -> Any:
    @functools.wraps(func)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        return func(*args, **kwargs)

    return bounded


def _check_method(obj: Any, args: tuple, kwargs: dict) -> tuple:
    """A call of a string's (or an int's) method that makes a larger value, checked; a ``join``'s
    iterable made a list (read once for its size, once to join)."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if isinstance(owner, str):
        if name in ("center", "ljust", "rjust", "zfill") and args:
            _width(args[0], f"str.{name} a width")
        elif name == "expandtabs":
            size = args[0] if args else kwargs.get("tabsize", 8)
            if isinstance(size, int):
                _chars(len(owner) + owner.count("\t") * max(size - 1, 0), "an expanded text")
        elif name == "replace" and len(args) >= 2:
            found = owner.count(str(args[0])) if args[0] else len(owner) + 1
            if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
                found = min(found, args[2])
            _chars(len(owner) + found * max(0, len(str(args[1])) - len(str(args[0]))), "a replaced text")
        elif name == "join" and args:
            items = _materialized(args[0])
            _chars(sum(len(x) if isinstance(x, str) else 0 for x in items) + len(owner) * max(0, len(items) - 1),
                   "a joined text")
            args = (items, *args[1:])
    elif isinstance(owner, int) and name == "to_bytes":
        _width(args[0] if args else kwargs.get("length", 1), "int.to_bytes a length")
    return args


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 - Jinja's names
    from jinja2.utils import generate_lorem_ipsum

    if isinstance(n, int) and isinstance(max, int):
        _chars(n * max * 16, "a lorem ipsum")
    return generate_lorem_ipsum(n=n, html=html, min=min, max=max)


# ---------------------------------------------------------------------------------------------
# the environment


def _constant_chars(body: list) -> int:
    """Characters of template text directly in a body (not in the nested bodies that count their own)."""
    from jinja2 import nodes

    total, stack = 0, list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, nodes.TemplateData):
            total += len(node.data)
        elif isinstance(node, (nodes.For, nodes.Macro, nodes.CallBlock)):
            continue
        elif isinstance(node, nodes.Node):
            stack.extend(node.iter_child_nodes())
    return total


@functools.cache
def environment() -> Any:
    """The sandbox (one per process: the templates are untrusted code; jinja2 >= 3.1.6 has no
    known sandbox escape)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes as nodes
    import jinja2.utils
    from jinja2.compiler import CodeGenerator
    from jinja2.defaults import DEFAULT_FILTERS, DEFAULT_TESTS
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.visitor import NodeTransformer

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: renders its body and records where it starts,
        counted as transformers counts it (the characters already yielded by the render)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_span"), [], [], body).set_lineno(lineno)

        def _span(self, caller: Any) -> str:
            text = caller()
            tracking = TRACKING.get()
            if tracking is not None:
                tracking.spans.append((tracking.emitted, tracking.emitted + len(text)))
            return text

    class Steps(jinja2.ext.Extension):
        """The instrumentation of loops and bodies (``instrument``) and what it calls at render time."""

        def instrument(self, template: Any) -> Any:
            ext = self

            class Instrument(NodeTransformer):
                """Each loop's items counted (``_each``), each pass through a body charged
                (``_enter``; ``_leave`` at its end), each loop's end said (``_exit``). A loop is
                *streamed* when no enclosing macro, call, filter or set block buffers its output:
                only those tell an observer where in the text they are."""

                def __init__(self) -> None:
                    self.buffered, self.next_id = 0, 0

                def _stmt(self, method: str, *args: Any) -> Any:
                    return nodes.ExprStmt(ext.call_method(method, [nodes.Const(a) for a in args]))

                def visit_For(self, node: Any) -> Any:
                    streamed = not self.buffered and not node.recursive
                    self.generic_visit(node)
                    loop = self.next_id
                    self.next_id += 1
                    node.iter = ext.call_method("_each", [nodes.Const(loop), nodes.Const(streamed),
                                                          nodes.Const(bool(node.else_)), node.iter])
                    node.body = [self._stmt("_enter", loop, _constant_chars(node.body)), *node.body,
                                 self._stmt("_leave", loop)]
                    return [node, self._stmt("_exit", loop)]

                def _buffered(self, node: Any) -> Any:
                    self.buffered += 1
                    try:
                        self.generic_visit(node)
                    finally:
                        self.buffered -= 1
                    if isinstance(node, (nodes.Macro, nodes.CallBlock)):
                        node.body = [self._stmt("_enter", -1, _constant_chars(node.body)), *node.body]
                    return node

                visit_Macro = visit_CallBlock = visit_FilterBlock = visit_AssignBlock = visit_Block = _buffered

            return Instrument().visit(template)

        def _each(self, loop: int, streamed: bool, has_else: bool, iterable: Any) -> Any:
            observer = OBSERVER.get()
            if observer is not None:
                iterable = observer.loop_started(loop, streamed, has_else, iterable)
            return _counted(iterable)

        def _enter(self, loop: int, chars: int) -> str:
            budget = BUDGET.get()
            if budget is not None:
                budget.tick()
                budget.charge(chars)
            observer = OBSERVER.get()
            if observer is not None and loop >= 0:
                observer.entered(loop)
            return ""

        def _leave(self, loop: int) -> str:
            observer = OBSERVER.get()
            if observer is not None:
                observer.left(loop)
            return ""

        def _exit(self, loop: int) -> str:
            observer = OBSERVER.get()
            if observer is not None:
                observer.exited(loop)
            return ""

    def _counted(iterable: Any) -> Any:
        for item in iterable:
            _tick()
            yield item

    class TemplateDict:
        """``dict(...)`` in a template, without the type's attributes to climb through."""
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            _tick()
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            _tick()
            if args:
                args = (_materialized(args[0]), *args[1:])
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        """``namespace(...)`` refusing underscore names (no way to CPython internals); its reads are
        told to an observer (a later turn can change what a namespace holds)."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: B902 - namespace(self=...) must work
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                _check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __getattribute__(self, name: str) -> Any:
            if name not in ("_Namespace__attrs", "__class__"):
                observer = OBSERVER.get()
                if observer is not None:
                    observer.namespace_read()
            return jinja2.utils.Namespace.__getattribute__(self, name)

        def __setitem__(self, name: str, value: Any) -> None:
            _check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace cannot hold the underscore name {name!r}")

    def raise_exception(message: Any) -> None:
        raise Refused(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # not Jinja's own filter: that one escapes HTML characters
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def finalize(value: Any) -> Any:
        """Every ``{{ }}`` value: its characters charged as produced."""
        return _made(value) if type(value) is str else value

    dict_names = frozenset(dir(dict))

    class Generator(CodeGenerator):
        """``a ~ b`` through ``environment.concat``, which checks the length first (a loop that
        doubles a string with ``~`` would otherwise reach gigabytes in thirty passes)."""

        def visit_ExprStmt(self, node: Any, frame: Any) -> None:
            """The instrumentation's own calls made directly (not through the sandbox's ``call``)."""
            call = node.node
            if (isinstance(call, nodes.Call) and isinstance(call.node, nodes.ExtensionAttribute)
                    and call.node.identifier == Steps.identifier):
                self.newline(node)
                self.write(f"environment.extensions[{call.node.identifier!r}].{call.node.name}(")
                for arg in call.args:
                    self.visit(arg, frame)
                    self.write(", ")
                self.write(")")
                return
            super().visit_ExprStmt(node, frame)

        def visit_Concat(self, node: Any, frame: Any) -> None:
            self.write("environment.concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class Sandbox(ImmutableSandboxedEnvironment):
        """The same sandbox, with operators that check what they make and calls counted; and
        ``message.content`` on a plain dict looked up at once: a dict instance has no attribute of
        its own, so for a name that is not one of ``dict``'s the sandbox's ``getattr`` always ends
        in the item (or undefined), after a failed ``getattr`` (a third of a render's time)."""

        intercepted_binops = frozenset(("*", "**", "+", "%"))  # nor folded at compile time
        code_generator_class = Generator

        def concat(self, values: tuple) -> str:
            _tick()
            parts = [str(v) for v in values]
            _chars(sum(map(len, parts)), "a concatenation")
            return _made("".join(parts))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "+" and type(left) is str and type(right) is str:  # the usual one, inline
                size = len(left) + len(right)
                if size > MAX_VALUE_CHARS:
                    _chars(size, "a concatenation")
                budget = BUDGET.get()
                if budget is not None:
                    budget.steps -= 1
                    budget.chars -= size
                    if budget.steps < 0 or budget.chars < 0:
                        budget.tick(0)
                        budget.charge(0)
                return left + right
            _tick()
            _check_binop(operator, left, right)
            return _made(super().call_binop(context, operator, left, right))

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: B902, N805
            _tick()
            args = _check_method(__obj, args, kwargs)
            return _made(super().call(__context, __obj, *args, **kwargs))

        def getitem(self, obj: Any, argument: Any) -> Any:
            value = super().getitem(obj, argument)
            return _made(value) if type(argument) is slice else value

        def wrap_str_format(self, value: Any) -> Any:
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            fmt = value.__self__

            def checked(*args: Any, **kwargs: Any) -> str:
                check_format(fmt)
                return wrapped(*args, **kwargs)

            return checked

        def getattr(self, obj: Any, attribute: str) -> Any:
            if type(obj) is dict and type(attribute) is str and attribute not in dict_names:
                try:
                    return obj[attribute]
                except KeyError:
                    return self.undefined(obj=obj, name=attribute)
            return super().getattr(obj, attribute)

        def _parse(self, source: str, name: Any, filename: Any) -> Any:
            return self.extensions[Steps.identifier].instrument(super()._parse(source, name, filename))

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, finalize=finalize,
                  extensions=[Generation, Steps, jinja2.ext.loopcontrols])
    env.filters = {name: _bounded_filter(name, f) for name, f in {**DEFAULT_FILTERS, "tojson": tojson}.items()}
    env.tests = {name: _bounded_test(f) for name, f in DEFAULT_TESTS.items()}
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f),
                       dict=TemplateDict(), namespace=TemplateNamespace, lipsum=_lipsum)
    return env


class Refused(Exception):
    """The template's own ``raise_exception(message)``: its message is the reason."""
