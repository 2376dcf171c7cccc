"""A chat record made a conversation, rendered by its chat template, with the character spans the
loss counts (``pack-tokens --chat``; ``text/chat_tokens.py`` turns them into a token mask).

Which characters train (``--train-on``):

- ``assistant``: what the assistant says. With a template that has ``{% generation %}`` blocks, the
  blocks' spans, exactly those transformers' ``return_assistant_tokens_mask`` uses (so the mask is
  its ``assistant_masks``). Without, each assistant message's turn as the template adds it: for
  message k, from the end of ``render(messages[:k], add_generation_prompt=True)`` to the end of
  ``render(messages[:k+1])``, the message with the template's end of turn, but not the header the
  generation prompt writes. Both renders must be prefixes of the whole conversation's text (a
  template that rewrites earlier turns, like one dropping old reasoning, cannot be read this way:
  give it ``{% generation %}`` blocks).
- ``last``: only the last assistant message's: with ``{% generation %}`` blocks, the blocks its
  rendering adds after those of the messages before it (all of them, where a template writes its
  content and end of turn in separate blocks); else its turn as above.
- ``completion``: prompt/completion pairs: everything after ``render(prompt,
  add_generation_prompt=True)`` (TRL's completion mask, at the character level).
- ``all``: the whole text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardsmith.text.chat_template import ChatError, ChatTemplate
from shardsmith.text.chat_turns import prefix_length, turn_spans

ROLES = ("system", "developer", "user", "assistant", "tool", "ipython", "function")
TRAIN_ON = ("assistant", "last", "completion", "all")
_NAMES_SHOWN = 8
MAX_CHARS = 4 << 20  # a conversation is rendered and encoded whole: longer ones are bad records
MESSAGE_BINS = 16  # messages per conversation are counted up to this; more count as this many
MAX_DEPTH = 200  # lists and objects nested in a conversation (deeper ones overflow the stack of what reads them)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatFields:
    """Where a record keeps its conversation: ``messages`` (a list of ``{"role", "content"}``), or a
    ``prompt`` and a ``completion`` (``--prompt-field``/``--completion-field``: a string is one user
    or one assistant message, a list is messages, TRL's conversational prompt-completion); ``tools``:
    the tool definitions passed to the template when the record has them (TRL's column)."""

    messages: str = "messages"
    prompt: str | None = None
    completion: str | None = None
    tools: str = "tools"

    @property
    def pairs(self) -> bool:
        return self.prompt is not None and self.completion is not None


@dataclass(frozen=True, slots=True)
class Conversation:
    """Messages ready for a template; ``prompt_messages``: how many of them are the prompt (pairs
    only, else None)."""

    messages: list[dict]
    tools: list[dict] | None
    prompt_messages: int | None


def _fields_found(record: Mapping) -> str:
    names = [str(k) for k in record]
    shown = ", ".join(repr(n) for n in names[:_NAMES_SHOWN])
    more = f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
    return f"it has {shown}{more}" if names else "it has no fields"


def _checked(messages: Any, what: str) -> list[dict]:
    """``messages`` when they are a list of message objects with a known role and a content."""
    if not isinstance(messages, list):
        raise ChatError(f"{what} is not a list of messages (a {type(messages).__name__})")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatError(f"{what}: message {i} is not an object (a {type(message).__name__})")
        role = message.get("role")
        if not isinstance(role, str):
            raise ChatError(f"{what}: message {i} has no \"role\"")
        if role not in ROLES:
            raise ChatError(f"{what}: message {i} has the unknown role {role!r} (known: {', '.join(ROLES)})")
        if "content" not in message and not message.get("tool_calls"):
            raise ChatError(f"{what}: message {i} has no \"content\"")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ChatError(f"{what}: message {i}'s content is a {type(content).__name__}, not text or a list")
    return messages


def _side(record: Mapping, field: str, role: str) -> list[dict]:
    if field not in record:
        raise ChatError(f"no {field!r} field ({_fields_found(record)})")
    value = record[field]
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return _checked(value, repr(field))


def _json_list(value: Any, field: str) -> Any:
    """A list kept as a JSON string (as Parquet exports often hold messages and tools), parsed."""
    if not isinstance(value, str):
        return value
    import orjson

    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        raise ChatError(f"{field!r} is a string that is not JSON") from None


def _shallow(value: Any, what: str) -> Any:
    """``value`` when its lists and objects nest fewer than ``MAX_DEPTH`` levels (walked without
    recursion): the template's preparation, its ``tojson`` and the record's hash all recurse."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (list, dict)):
            if depth >= MAX_DEPTH:
                raise ChatError(f"{what} nests lists and objects {MAX_DEPTH} levels deep or more")
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return value


def _sized(messages: list[dict], what: str) -> list[dict]:
    """Refuse, before any rendering, a conversation whose contents alone pass ``MAX_CHARS`` (the
    turn-by-turn rule renders every prefix of it)."""
    chars = sum(len(c) for m in messages if isinstance(c := m.get("content"), str))
    if chars > MAX_CHARS:
        raise ChatError(f"{what}: {chars:,} characters of content, more than the {MAX_CHARS:,} a conversation "
                        f"may hold")
    return messages


def record_text(record: Any, fields: ChatFields) -> str:
    """The conversation as read, as one text: its messages (or prompt and completion) as JSON with
    sorted keys. What ``--provenance`` hashes for a chat document, and ``trace`` reads back."""
    import orjson

    if not isinstance(record, Mapping):
        return ""
    value = [record.get(fields.prompt), record.get(fields.completion)] if fields.pairs else \
        record.get(fields.messages)
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str).decode()
    except orjson.JSONEncodeError:  # nested past orjson's depth: no conversation (conversation_of refuses it)
        return ""


def _tools(record: Mapping, field: str) -> list[dict] | None:
    """The record's tool definitions (a list of objects, or that list as a JSON string), or None."""
    value = record.get(field)
    if value is None:
        return None
    value = _json_list(value, field)
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ChatError(f"{field!r} is not a list of tool objects")
    return _shallow(value, repr(field))


def conversation_of(record: Any, fields: ChatFields) -> Conversation:
    """The conversation a record holds; ``ChatError`` when it holds none (not an object, a missing
    field, messages that are not a list of ``{"role", "content", ...}`` objects, an unknown role, no
    messages at all)."""
    if not isinstance(record, Mapping):
        raise ChatError(f"a chat record is a JSON object, not a {type(record).__name__}")
    tools = _tools(record, fields.tools)
    if fields.pairs:
        prompt = _side(record, fields.prompt, "user")
        completion = _side(record, fields.completion, "assistant")
        if not completion:
            raise ChatError(f"the completion {fields.completion!r} has no messages")
        return Conversation(_sized(_shallow(prompt + completion, "the pair"), "the pair"), tools, len(prompt))
    if fields.messages not in record:
        raise ChatError(f"no {fields.messages!r} field ({_fields_found(record)})")
    messages = _checked(_json_list(record[fields.messages], fields.messages), repr(fields.messages))
    if not messages:
        raise ChatError(f"{fields.messages!r} is an empty conversation")
    return Conversation(_sized(_shallow(messages, repr(fields.messages)), repr(fields.messages)), tools, None)


def _tidy(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint (touching or overlapping spans merged), without empty ones."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def rendered(template: ChatTemplate, conv: Conversation, *, train_on: str) -> tuple[str, list[tuple[int, int]]]:
    """(the text ``apply_chat_template(conv.messages, tools=conv.tools)`` renders, the character spans
    the loss counts), by the rule ``train_on`` names (the module's docstring). The spans of the
    ``assistant`` and ``last`` rules over a template with ``{% generation %}`` blocks are the blocks'
    own, as transformers records them (empty ones included: a token across one is in its mask);
    all others are sorted, disjoint and not empty. ``completion`` needs a conversation from pairs
    (``ValueError`` otherwise: the caller checks the options)."""
    if train_on not in TRAIN_ON:
        raise ValueError(f"train_on must be one of {TRAIN_ON}, not {train_on!r}")
    with template.budget(messages=len(conv.messages) + len(conv.tools or ())):  # shared by all its renders
        return _rendered(template, conv, train_on=train_on)


def _rendered(template: ChatTemplate, conv: Conversation, *, train_on: str) -> tuple[str, list[tuple[int, int]]]:
    messages, tools = conv.messages, conv.tools
    text, generation = template.render(messages, tools=tools)
    if train_on == "all":
        return text, _tidy([(0, len(text))])
    if train_on == "completion":
        if conv.prompt_messages is None:
            raise ValueError("train_on='completion' needs prompt/completion pairs")
        start = prefix_length(template, messages[: conv.prompt_messages], tools, text, add_generation_prompt=True)
        return text, _tidy([(start, len(text))])
    if template.has_generation_for(tools=tools):
        spans = list(generation)
        if train_on == "last":  # the blocks the last assistant message adds: those after the earlier ones'
            last = max((k for k, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
            if last is None:
                return text, []
            before = template.render(messages[:last], tools=tools, allow_empty=True)[1] if last else []
            return text, spans[len(before):]
    else:  # text/chat_turns.py: the renders of prefixes, in one render where the template allows
        spans = _tidy(turn_spans(template, messages, tools, text))
    if train_on == "last":
        spans = spans[-1:]
    return text, spans
