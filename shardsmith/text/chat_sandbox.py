"""The sandboxed Jinja2 environment chat templates render in: transformers' own (``trim_blocks``,
``lstrip_blocks``, loop controls, ``{% generation %}``, ``raise_exception``, ``strftime_now``, a
``tojson`` that escapes no HTML, ``dict`` and a ``namespace`` without the way to CPython internals),
with bounds a crafted template cannot pass.

A template from the Hub is code: ``{{ 'x' * 10**9 }}`` allocates a gigabyte (at compile time, as
Jinja folds constants), nested ``range(100000)`` loops never end, 2,000 nested blocks overflow
the parser's stack. Here every render runs under a ``Budget``: steps (a loop's item, a call, a
filter, an operator, and what each reads: characters and items) for all renders of a
conversation, and characters made (the strings and lists operations return, the text produced)
for each render; counted, never timed, so the same template and conversation stop at the same
step on any machine (``text/chat_bounds.py``). Each operation that can make a value much larger
than its operands (string and list repetition, ``+``, ``~``, ``**``, ``%``, ``format``,
``center``, ``indent``, ``join``, ``replace``...) checks the size it would make first. Reaching
a bound is ``TemplateLimit``, one line (``chat_template.py`` makes it the conversation's
``ChatError``). Nothing is computed while compiling (no constant folded, no filter called), so
compiling allocates nothing; comparisons, dict keys and slices go through the environment too.

The loops are instrumented (``Steps``, ``text/chat_loops.py``): each item and each pass through a body is a step, and a
pass's constant text is charged as produced; an observer set for a render (``OBSERVER``:
``chat_turns.Observations``) also hears where loops start, pass and end, and reads of state (a
namespace, an iterator a filter made): what the turn-by-turn rule needs to find every prefix's
render in one.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from shardsmith.text.chat_bounds import (
    BUDGET,
    CHARS_PER_STEP,
    MAX_TEMPLATE_TOKENS,
    MAX_VALUE_CHARS,
    OBSERVER,
    check_binop,
    check_chars,
    check_format,
    made,
    read,
    read_text,
    seen,
    tick,
)
from shardsmith.text.chat_filters import bounded_filter, bounded_test, check_method, lipsum, materialized
from shardsmith.text.chat_loops import extensions, short_text


def _read_free(node: Any) -> bool:
    """A constant an operation reads at no cost: a short string, a number, a bool or None."""
    from jinja2 import nodes

    return type(node) is nodes.Const and (short_text(node) or type(node.value) in (int, float, bool, type(None))
                                          and not (type(node.value) is int and node.value.bit_length() > 64))


@functools.cache
def environment() -> Any:
    """The sandbox (one per process: the templates are untrusted code; jinja2 >= 3.1.6 has no
    known sandbox escape)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes as nodes
    import jinja2.utils
    from jinja2.compiler import CodeGenerator, operators
    from jinja2.defaults import DEFAULT_FILTERS, DEFAULT_TESTS
    from jinja2.runtime import Macro
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    Generation, Steps = extensions()

    class TemplateDict:
        """``dict(...)`` in a template, without the type's attributes to climb through."""
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            tick()
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            tick()
            if args:
                args = (materialized(args[0]), *args[1:])
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        """``namespace(...)`` refusing underscore names (no way to CPython internals); its reads (of
        an attribute, or of all of them as text) are told to an observer (a later turn can change
        what a namespace holds)."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: B902 - namespace(self=...) must work
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                _check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __getattribute__(self, name: str) -> Any:
            if name not in ("_Namespace__attrs", "__class__"):
                _state_read()
            return jinja2.utils.Namespace.__getattribute__(self, name)

        def __repr__(self) -> str:  # (``{{ ns }}``, ``ns|string``: every attribute read at once)
            _state_read()
            return jinja2.utils.Namespace.__repr__(self)

        def __setitem__(self, name: str, value: Any) -> None:
            _check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    def _state_read() -> None:
        observer = OBSERVER.get()
        if observer is not None:
            observer.state_read()

    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace cannot hold the underscore name {name!r}")

    def raise_exception(message: Any) -> None:
        raise Refused(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # not Jinja's own filter: that one escapes HTML characters
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    @jinja2.pass_eval_context
    def finalize(eval_ctx: Any, value: Any) -> Any:
        """Every ``{{ }}`` value: its characters charged as produced; a value that is not a string
        read first (its text checked before it is made). Taking the evaluation context keeps Jinja
        from finalizing constants while compiling, uncounted (``{{ "<a megabyte>" }}`` in a loop)."""
        if type(value) is str:  # (``made`` without its type tests: every ``{{ }}`` of every render comes here)
            budget = BUDGET.get()
            if budget is not None:
                budget.charge(len(value))
            return value
        read_text(value, "a value to write out")
        return made(str(value))

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

        def visit_Compare(self, node: Any, frame: Any) -> None:
            """Each operand read (``chat_bounds.seen``): ``'y' in text`` scans it, ``a == b`` may
            walk two structures."""
            self.write("(")
            self._seen(node.expr, frame)
            for op in node.ops:
                self.write(f" {operators[op.op]} ")
                self._seen(op.expr, frame)
            self.write(")")

        def _seen(self, node: Any, frame: Any) -> None:
            if _read_free(node):
                self.visit(node, frame)
                return
            self.write("environment.seen(")
            self.visit(node, frame)
            self.write(")")

        def visit_Dict(self, node: Any, frame: Any) -> None:
            """Keys read (hashing one walks it)."""
            self.write("{")
            for item in node.items:
                self.write("environment.seen(")
                self.visit(item.key, frame)
                self.write("): ")
                self.visit(item.value, frame)
                self.write(", ")
            self.write("}")

        def visit_Getitem(self, node: Any, frame: Any) -> None:
            """A slice is made here (Jinja compiles ``x[a:b]`` straight to Python, past ``getitem``)."""
            if isinstance(node.arg, nodes.Slice):
                self.write("environment.made(")
                super().visit_Getitem(node, frame)
                self.write(")")
            else:
                super().visit_Getitem(node, frame)

    class Sandbox(ImmutableSandboxedEnvironment):
        """The same sandbox, with operators that check what they make and calls counted; and
        ``message.content`` on a plain dict looked up at once: a dict instance has no attribute of
        its own, so for a name that is not one of ``dict``'s the sandbox's ``getattr`` always ends
        in the item (or undefined), after a failed ``getattr`` (a third of a render's time)."""

        intercepted_binops = frozenset(("*", "**", "+", "-", "%"))
        code_generator_class = Generator

        seen = staticmethod(seen)
        made = staticmethod(made)

        def concat(self, values: tuple) -> str:
            tick()
            for v in values:
                if type(v) is not str:
                    read_text(v, "a value to concatenate")
            parts = [str(v) for v in values]
            check_chars(sum(map(len, parts)), "a concatenation")
            return made("".join(parts))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "+" and type(left) is str and type(right) is str:  # the usual one, inline
                size = len(left) + len(right)
                if size > MAX_VALUE_CHARS:
                    check_chars(size, "a concatenation")
                budget = BUDGET.get()
                if budget is not None:
                    budget.steps -= 1 + size // CHARS_PER_STEP
                    budget.chars -= size
                    if budget.steps < 0 or budget.chars < 0:
                        budget.tick(0)
                        budget.charge(0)
                return left + right
            tick()
            check_binop(operator, left, right)
            return made(super().call_binop(context, operator, left, right))

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: B902, N805
            tick()
            if not (isinstance(__obj, Macro) or isinstance(getattr(__obj, "__self__", None), Steps)):
                # (a macro takes its arguments as they are, unread; a loop reads its items one by one)
                for value in (*args, *kwargs.values()):
                    read(value)
            args = check_method(__obj, args, kwargs)
            return made(super().call(__context, __obj, *args, **kwargs))

        def getitem(self, obj: Any, argument: Any) -> Any:
            if type(argument) not in (str, int):  # (a tuple key is hashed: read)
                read(argument)
            value = super().getitem(obj, argument)
            return made(value) if type(argument) is slice else value

        def wrap_str_format(self, value: Any) -> Any:
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            fmt = value.__self__

            def checked(*args: Any, **kwargs: Any) -> str:
                check_format(fmt, args, kwargs)
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
            """The template parsed and instrumented, if it is not too long to compile: Python's
            compiler takes about 2 KB for each of its tokens (a 10 MB template of ``{{ x }}``:
            16 GB, four minutes)."""
            for count, (lineno, _, _) in enumerate(self.lex(source, name, filename)):
                if count >= MAX_TEMPLATE_TOKENS:
                    raise jinja2.TemplateSyntaxError(f"the template has more than {MAX_TEMPLATE_TOKENS:,} tokens, "
                                                     f"more than a chat template needs", lineno, name, filename)
            return self.extensions[Steps.identifier].instrument(super()._parse(source, name, filename))

    # optimized=False: nothing is computed while compiling (a constant filtered ten times over into
    # 30 MB each, uncounted), every value is made as the template renders, under its bounds
    env = Sandbox(trim_blocks=True, lstrip_blocks=True, finalize=finalize, optimized=False,
                  extensions=[Generation, Steps, jinja2.ext.loopcontrols])
    env.filters = {name: bounded_filter(name, f) for name, f in {**DEFAULT_FILTERS, "tojson": tojson}.items()}
    env.tests = {name: bounded_test(name, f) for name, f in DEFAULT_TESTS.items()}
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f),
                       dict=TemplateDict(), namespace=TemplateNamespace, lipsum=lipsum)
    return env


class Refused(Exception):
    """The template's own ``raise_exception(message)``: its message is the reason."""
