"""How a chat template's loops and bodies are instrumented, and its ``{% generation %}`` blocks
recorded (the extensions ``text/chat_sandbox.py`` builds its environment with).

``Steps`` rewrites each parsed template: each loop's items are counted (a step each), each pass
through a body is a step and its constant template text is charged as produced (``_enter``), a
short constant written with ``{{ }}`` becomes template text (charged with its pass, not through
``finalize`` each time); an observer set for a render (``OBSERVER``: ``chat_turns.Observations``)
also hears where loops start, pass and end. ``Generation`` records where each generation block's
text starts and ends, counted as transformers counts it. jinja2 is imported only when a template
is first compiled (``extensions()``): ``pack-tokens`` without ``--chat`` never imports it.
"""

from __future__ import annotations

import functools
from typing import Any

from shardsmith.text.chat_bounds import BUDGET, OBSERVER, TRACKING, tick

SHORT_CONSTANT = 256  # a constant written or compared shorter than this costs nothing to read


def short_text(node: Any) -> bool:
    """A string constant short enough to be read for free (or, written, charged with its pass's text)."""
    from jinja2 import nodes

    return type(node) is nodes.Const and type(node.value) is str and len(node.value) < SHORT_CONSTANT


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


def _counted(iterable: Any) -> Any:
    for item in iterable:
        tick()
        yield item


@functools.cache
def extensions() -> tuple[Any, Any]:
    """``(Generation, Steps)``, the two extension classes (one pair per process: the sandbox checks
    calls against ``Steps``)."""
    import jinja2.ext
    import jinja2.nodes as nodes
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

                def visit_Output(self, node: Any) -> Any:
                    """``{{ 'short constant' }}`` written as template text: charged with the pass's
                    text (``_enter``), not through ``finalize`` each time it is written."""
                    self.generic_visit(node)
                    node.nodes = [nodes.TemplateData(child.value).set_lineno(child.lineno) if short_text(child)
                                  else child for child in node.nodes]
                    return node

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

    return Generation, Steps
