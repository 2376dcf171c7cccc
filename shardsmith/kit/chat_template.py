"""Chat templates rendered exactly as ``transformers`` renders them (``apply_chat_template``).

The same sandboxed Jinja2 environment (``trim_blocks``, ``lstrip_blocks``, loop controls, the
``{% generation %}`` tag, ``raise_exception``, ``strftime_now``, ``tojson``, ``dict``, a namespace
that refuses underscore names) and the same preparation of the inputs (keys whose value is None
dropped, everything rebuilt from plain JSON types, reasoning fields aliased): the text is the one
transformers would tokenize, and the generation spans are the ones its assistant mask is built
from (``kit/chat_files.py`` finds a tokenizer's template and special tokens).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import datetime
from functools import cache
from typing import Any

# the named special tokens of transformers v5 (``SPECIAL_TOKENS_ATTRIBUTES``); any other ``*_token``
# string of the config is a model-specific one, also in ``special_tokens_map``
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # the first is the one templates read
_REASON_CHARS = 300


class ChatError(ValueError):
    """Why one conversation cannot be rendered (a bad record), in one line."""


class _Refused(Exception):
    """The template's own ``raise_exception(message)``: its message is the reason."""


class _Tracking:
    """Characters yielded so far by the render in progress, and the generation spans it closed."""

    def __init__(self) -> None:
        self.emitted, self.spans = 0, []


_TRACKING: ContextVar[_Tracking | None] = ContextVar("shardsmith_chat_generation", default=None)


@cache
def _environment() -> Any:
    """The sandbox transformers renders chat templates in (one per process: templates from the Hub
    are untrusted code; jinja2 >= 3.1.6 has no known sandbox escape)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: renders its body and records where it starts,
        counted as transformers counts it (the characters already yielded by the render)."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_span"), [], [], body).set_lineno(lineno)

        def _span(self, caller: Any) -> str:
            text = caller()
            tracking = _TRACKING.get()
            if tracking is not None:
                tracking.spans.append((tracking.emitted, tracking.emitted + len(text)))
            return text

    class TemplateDict:
        """``dict(...)`` in a template, without the type's attributes to climb through."""
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        """``namespace(...)`` refusing underscore names (no way to CPython internals)."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: B902 - namespace(self=...) must work
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                _check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            _check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace cannot hold the underscore name {name!r}")

    def raise_exception(message: Any) -> None:
        raise _Refused(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:  # not Jinja's own filter: that one escapes HTML characters
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    dict_names = frozenset(dir(dict))

    class Sandbox(ImmutableSandboxedEnvironment):
        """The same sandbox, with ``message.content`` on a plain dict looked up at once: a dict
        instance has no attribute of its own, so for a name that is not one of ``dict``'s the
        sandbox's ``getattr`` always ends in the item (or undefined), after a failed ``getattr``
        (a third of a render's time)."""

        def getattr(self, obj: Any, attribute: str) -> Any:
            if type(obj) is dict and type(attribute) is str and attribute not in dict_names:
                try:
                    return obj[attribute]
                except KeyError:
                    return self.undefined(obj=obj, name=attribute)
            return super().getattr(obj, attribute)

    env = Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda f: datetime.now().strftime(f),
                       dict=TemplateDict(), namespace=TemplateNamespace)
    return env


_SCALARS = frozenset((str, int, float, bool, type(None)))


def _plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types as transformers does (no object a template could
    climb through: subclasses made their base type, anything else a "<TypeName>" placeholder)."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:  # what JSON records hold: the scalars inline, no call for each
        return {k if type(k) is str else _plain(k): v if type(v) in _SCALARS else _plain(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _SCALARS else _plain(v) for v in value]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    item = getattr(value, "item", None)
    if kind.__module__ == "numpy" and callable(item):  # a numpy scalar: np.bool_(False) must stay falsy
        return _plain(item())
    return f"<{kind.__name__}>"


def _messages(messages: Any, allow_empty: bool) -> list[dict]:
    """The messages as transformers hands them to a template: dicts without their None values,
    plain data, the reasoning under each of its names."""
    if not isinstance(messages, (list, tuple)) or not (messages or allow_empty):
        raise ChatError("an empty conversation" if isinstance(messages, (list, tuple))
                        else "the messages are not a list")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatError(f"message {i} is not an object")
        message = _plain({k: v for k, v in message.items() if v is not None}) if type(message) is not dict else {
            k if type(k) is str else _plain(k): v if type(v) in _SCALARS else _plain(v)
            for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


class ChatTemplate:
    """A chat template compiled in the sandboxed Jinja2 environment transformers uses. Picklable: it
    holds the source(s) and variables only, each process compiles them on first use. ``source``: one
    template, or named ones (transformers' list of ``{name, template}``: "tool_use" renders
    conversations with tools when there is one, "default" the others); ``variables``: passed to
    every render (the tokenizer's ``special_tokens_map``: bos_token, eos_token, ...)."""

    def __init__(self, *, source: str | Mapping[str, str], variables: Mapping[str, Any] = ()) -> None:
        self.sources: dict[str, str] = ({"default": source} if isinstance(source, str) else dict(source))
        self.named = not isinstance(source, str)
        self.variables: dict[str, Any] = _plain(dict(variables))
        blob = source if isinstance(source, str) else json.dumps(self.sources, sort_keys=True)
        self.sha256 = hashlib.sha256(blob.encode("utf-8")).hexdigest()
        self._compiled: dict[str, Any] = {}

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_compiled"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _compiled={})

    @property
    def has_generation(self) -> bool:
        """The template rendering conversations without tools has ``{% generation %}`` blocks."""
        return self.has_generation_for(tools=None)

    def has_generation_for(self, *, tools: list | None) -> bool:
        """The template that renders a conversation with these tools has ``{% generation %}`` blocks."""
        name = self._name(tools)
        return name is not None and bool(_GENERATION_TAG.search(self.sources[name]))

    def _name(self, tools: list | None) -> str | None:
        """The template transformers' ``get_chat_template`` picks (None: none of them fits)."""
        if not self.named:
            return "default"
        if tools is not None and "tool_use" in self.sources:
            return "tool_use"
        return "default" if "default" in self.sources else None

    def syntax_error(self) -> tuple[str, str] | None:
        """(template name, one-line message) of the first template that does not compile; None when all do."""
        import jinja2

        for name in self.sources:
            try:
                self._template(name)
            except jinja2.TemplateSyntaxError as exc:
                return name, one_line(f"line {exc.lineno}: {exc.message}")
        return None

    def _template(self, name: str) -> Any:
        compiled = self._compiled.get(name)
        if compiled is None:
            compiled = self._compiled[name] = _environment().from_string(self.sources[name])
        return compiled

    def render(self, messages: list[dict], *, tools: list[dict] | None = None, documents: list[dict] | None = None,
               add_generation_prompt: bool = False, allow_empty: bool = False) -> tuple[str, list[tuple[int, int]]]:
        """(text, the character spans of its ``{% generation %}`` blocks, in the order they closed):
        what ``apply_chat_template(messages, tools=..., documents=..., tokenize=False)`` gives, and
        the spans its assistant mask is computed from. A conversation the template cannot render
        (its ``raise_exception``, a missing field, a sandbox refusal...) raises ``ChatError``.
        ``allow_empty``: render no messages too (transformers refuses to; the turn-by-turn rule
        needs what a template writes before an assistant that speaks first)."""
        name = self._name(tools)
        if name is None:
            raise ChatError(f"the tokenizer's chat templates have no 'default' one (only {sorted(self.sources)})")
        chat = _messages(messages, allow_empty)
        if tools is not None:
            if not isinstance(tools, (list, tuple)) or not all(isinstance(t, Mapping) for t in tools):
                raise ChatError("the tools are not a list of objects")
            tools = _plain(list(tools))
        if documents is not None:
            if not isinstance(documents, (list, tuple)) or not all(isinstance(d, Mapping) for d in documents):
                raise ChatError("the documents are not a list of objects")
            documents = _plain(list(documents))
        import jinja2

        template = self._template(name)
        tracking = _Tracking()
        blocks = []
        token = _TRACKING.set(tracking)
        try:
            for block in template.generate(messages=chat, tools=tools, documents=documents,
                                           add_generation_prompt=add_generation_prompt, **self.variables):
                blocks.append(block)
                tracking.emitted += len(block)
        except _Refused as exc:
            raise ChatError(one_line(f"the chat template refused it: {exc}")) from None
        except (ArithmeticError, AttributeError, LookupError, RecursionError, TypeError, ValueError,
                jinja2.TemplateError) as exc:
            raise ChatError(one_line(f"the chat template failed on it ({type(exc).__name__}: {exc})")) from None
        finally:
            _TRACKING.reset(token)
        return "".join(blocks), tracking.spans
