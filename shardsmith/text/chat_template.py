"""Chat templates rendered exactly as ``transformers`` renders them (``apply_chat_template``).

The same sandboxed Jinja2 environment (``text/chat_sandbox.py``: ``trim_blocks``, ``lstrip_blocks``,
loop controls, the ``{% generation %}`` tag, ``raise_exception``, ``strftime_now``, ``tojson``,
``dict``, a namespace that refuses underscore names; and bounds a crafted template cannot pass)
and the same preparation of the inputs (keys whose value is None dropped, everything rebuilt from
plain JSON types, reasoning fields aliased): the text is the one transformers would tokenize, and
the generation spans are the ones its assistant mask is built from (``text/chat_files.py`` finds a
tokenizer's template and special tokens).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from shardsmith.text.chat_bounds import BUDGET, OBSERVER, TRACKING, Budget, TemplateLimit, Tracking
from shardsmith.text.chat_sandbox import Refused, environment

# the named special tokens of transformers v5 (``SPECIAL_TOKENS_ATTRIBUTES``); any other ``*_token``
# string of the config is a model-specific one, also in ``special_tokens_map``
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # the first is the one templates read
_REASON_CHARS = 300
# a conversation's renders may take this many steps (a loop's item, a call, a filter, an operator), and
# each render may make this many characters (the strings and lists operations return, the text produced:
# text/chat_sandbox.py counts them), 16 times the content a conversation may hold
STEPS_BASE = 1_000_000
STEPS_PER_MESSAGE = 4_000  # (rendering every prefix of a conversation its template reads ahead in takes ~3n²)
STEPS_MESSAGES = 2_000  # messages counted at most: a conversation's renders never take more than 9 million steps
CHARS_PER_RENDER = 64 << 20


class ChatError(ValueError):
    """Why one conversation cannot be rendered (a bad record), in one line."""


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
            except RecursionError:
                return name, "it nests blocks or expressions too deeply to compile"
            except SyntaxError as exc:  # Python's, of the code Jinja made (e.g. over 20 nested loops)
                return name, one_line(f"it compiles to Python that does not compile ({exc.msg})")
        return None

    def _template(self, name: str) -> Any:
        compiled = self._compiled.get(name)
        if compiled is None:
            compiled = self._compiled[name] = environment().from_string(self.sources[name])
        return compiled

    def budget(self, *, messages: int) -> Any:
        """The bounds of every render of one conversation of ``messages`` messages (and tools), for
        ``with``: steps shared by all its renders, characters each render may produce."""
        steps = STEPS_BASE + STEPS_PER_MESSAGE * min(messages, STEPS_MESSAGES)
        return _budgeted(Budget(steps=steps, chars=CHARS_PER_RENDER))

    def render(self, messages: list[dict], *, tools: list[dict] | None = None, documents: list[dict] | None = None,
               add_generation_prompt: bool = False, allow_empty: bool = False) -> tuple[str, list[tuple[int, int]]]:
        """(text, the character spans of its ``{% generation %}`` blocks, in the order they closed):
        what ``apply_chat_template(messages, tools=..., documents=..., tokenize=False)`` gives, and
        the spans its assistant mask is computed from. A conversation the template cannot render
        (its ``raise_exception``, a missing field, a sandbox refusal, a bound reached...) raises
        ``ChatError``. ``allow_empty``: render no messages too (transformers refuses to; the
        turn-by-turn rule needs what a template writes before an assistant that speaks first)."""
        return self.render_prepared(_messages(messages, allow_empty), tools=tools, documents=documents,
                                    add_generation_prompt=add_generation_prompt)

    def render_prepared(self, chat: Sequence[dict], *, tools: list[dict] | None = None,
                        documents: list[dict] | None = None, add_generation_prompt: bool = False,
                        observer: Any = None) -> tuple[str, list[tuple[int, int]]]:
        """``render`` of messages already prepared (``prepared``; or a sequence standing for them);
        ``observer``: told where loops start, pass and end as this render goes (``chat_turns.py``)."""
        name = self._name(tools)
        if name is None:
            raise ChatError(f"the tokenizer's chat templates have no 'default' one (only {sorted(self.sources)})")
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
        size = len(chat) if isinstance(chat, list) else 0  # (a tracked sequence is not asked its length)
        with self.budget(messages=size + len(tools or ())) if BUDGET.get() is None else _same():
            budget = BUDGET.get()
            budget.chars = budget.given[1]  # the characters bound is per render, the steps one per conversation
            tracking = Tracking()
            blocks = []
            token, seen = TRACKING.set(tracking), OBSERVER.set(observer)
            try:
                for block in template.generate(messages=chat, tools=tools, documents=documents,
                                               add_generation_prompt=add_generation_prompt, **self.variables):
                    blocks.append(block)
                    tracking.emitted += len(block)
            except Refused as exc:
                raise ChatError(one_line(f"the chat template refused it: {exc}")) from None
            except TemplateLimit as exc:
                raise ChatError(one_line(f"the chat template {exc}")) from None
            except (ArithmeticError, AttributeError, LookupError, RecursionError, TypeError, ValueError,
                    jinja2.TemplateError) as exc:
                raise ChatError(one_line(f"the chat template failed on it ({type(exc).__name__}: {exc})")) from None
            finally:
                TRACKING.reset(token)
                OBSERVER.reset(seen)
        return "".join(blocks), tracking.spans


def prepared(messages: Any, *, allow_empty: bool = False) -> list[dict]:
    """The messages as a template sees them (``render_prepared`` takes them)."""
    return _messages(messages, allow_empty)


@contextmanager
def _budgeted(budget: Budget) -> Iterator[Budget]:
    token = BUDGET.set(budget)
    try:
        yield budget
    finally:
        BUDGET.reset(token)


@contextmanager
def _same() -> Iterator[None]:
    yield None
