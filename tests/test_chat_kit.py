"""pack-tokens --chat's pure pieces against transformers: chat templates rendered in its sandbox
(text/chat_template.py), records made conversations and the characters that train (text/chat.py),
and ids with a loss mask (text/chat_tokens.py) equal to ``apply_chat_template(...,
return_assistant_tokens_mask=True)``'s ``input_ids`` and ``assistant_masks``, on both engines."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
from chat_models import (
    PIECES,
    TOOLS,
    Model,
    build_models,
    build_tokenizers,
    model_folder,
    random_conversation,
    tokenizer_json,
    transformers_answer,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardsmith.errors import UsageError
from shardsmith.text.chat import ChatFields, Conversation, conversation_of, rendered
from shardsmith.text.chat_files import load_chat_template
from shardsmith.text.chat_template import ChatError, ChatTemplate
from shardsmith.text.chat_tokens import ChatEncoder, mask_from_offsets

transformers = pytest.importorskip("transformers")

@pytest.fixture(scope="module")
def tokenizers_json() -> dict[str, str]:
    return build_tokenizers()


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizers_json) -> dict[str, Model]:
    return build_models(tmp_path_factory.mktemp("models"), tokenizers_json)


def _ours(model: Model, messages: list[dict], tools=None, *, train_on: str = "assistant"):
    record = {"messages": messages} if tools is None else {"messages": messages, "tools": tools}
    conv = conversation_of(record, ChatFields())
    text, spans = rendered(model.template, conv, train_on=train_on)
    return text, spans, {e: enc.encode([text], [spans]) for e, enc in model.encoders.items()}


def _offsets(model: Model, text: str) -> np.ndarray:
    """transformers' own character offsets of the text apply_chat_template tokenizes."""
    return np.array(model.reference(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"])


N = 150


def test_generation_template_equals_transformers_ids_and_assistant_masks(models):
    """Llama-3 with {% generation %}: ids and mask are transformers', sample by sample, on both engines;
    the gigatoken engine derives every offset itself (no text handed to tokenizers)."""
    model, rng, trained = models["llama3"], random.Random(1), 0
    for _ in range(N):
        messages = random_conversation(rng)
        text, ref = transformers_answer(model, messages)
        ours_text, spans, got = _ours(model, messages)
        assert ours_text == text
        for engine, (ids, mask, lengths) in got.items():
            assert ids.tolist() == ref["input_ids"], engine
            assert mask.astype(int).tolist() == ref["assistant_masks"], engine
            assert lengths.tolist() == [len(ids)]
        trained += int(got["hf"][1].sum())
    assert trained > 0
    assert model.encoders["gigatoken"].derives_offsets and model.encoders["gigatoken"].by_reference == 0


def test_empty_generation_blocks_inside_a_token_are_transformers_too(models):
    """Generation blocks that render nothing, between ": " and "\\n" (one pre-token): transformers
    marks a token across such a point, and so do we."""
    model, rng, across = models["plain"], random.Random(2), 0
    for _ in range(N):
        messages = random_conversation(rng)
        for m in messages:
            if m["role"] == "assistant" and rng.random() < 0.5:
                m["content"] = ""
        text, ref = transformers_answer(model, messages)
        _, spans, got = _ours(model, messages)
        for engine, (ids, mask, _) in got.items():
            assert ids.tolist() == ref["input_ids"] and mask.astype(int).tolist() == ref["assistant_masks"], engine
        offsets = _offsets(model, text)
        across += sum(1 for a, b in spans if a == b and ((offsets[:, 0] < a) & (offsets[:, 1] > a)).any())
    assert across > 0  # the case happened


def _chatml_by_hand(messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """ChatML written out here, with each assistant message's content and end of turn as its span."""
    text, spans = "", []
    if messages[0]["role"] != "system":
        text += "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    for m in messages:
        text += f"<|im_start|>{m['role']}\n"
        start = len(text)
        text += m["content"] + "<|im_end|>\n"
        if m["role"] == "assistant" and len(text) > start:
            spans.append((start, len(text)))
    return text, spans


def test_turn_by_turn_rule_on_chatml_marks_the_assistant_turns(models):
    """ChatML has no generation blocks: each assistant message with its end of turn trains (checked
    against ChatML written by hand), the ids are transformers', and the mask is transformers' own
    offsets over those spans, on both engines."""
    model, rng = models["chatml"], random.Random(3)
    assert not model.template.has_generation
    for _ in range(N):
        messages = random_conversation(rng)
        text, ref = transformers_answer(model, messages)
        ours_text, spans, got = _ours(model, messages)
        assert (ours_text, spans) == (text, _chatml_by_hand(messages)[1]) and _chatml_by_hand(messages)[0] == text
        want = mask_from_offsets(_offsets(model, text), spans)
        for engine, (ids, mask, _) in got.items():
            assert ids.tolist() == ref["input_ids"], engine
            assert np.array_equal(mask, want), engine
    assert model.encoders["gigatoken"].by_reference == 0


def test_tools_template_with_system_prompt_and_tool_calls(models):
    """Qwen2.5's tools template (NFC normalizer, split regex): the tools in the system prompt, assistant
    tool calls and tool replies; ids are transformers', each assistant turn trains from after its
    header to its end of turn; text that NFC changes goes to tokenizers and nothing else does."""
    model, rng, not_nfc = models["qwen"], random.Random(4), 0
    import unicodedata

    for i in range(N):
        tools = TOOLS if i % 3 else None
        messages = random_conversation(rng, tools=True)
        text, ref = transformers_answer(model, messages, tools)
        ours_text, spans, got = _ours(model, messages, tools)
        assert ours_text == text
        want = mask_from_offsets(_offsets(model, text), spans)
        for engine, (ids, mask, _) in got.items():
            assert ids.tolist() == ref["input_ids"] and np.array_equal(mask, want), engine
        said = [m for m in messages if m["role"] == "assistant"]
        assert len(spans) == len(said)
        for (a, b), m in zip(spans, said):  # the header before, the message and its end of turn inside
            assert text[:a].endswith("<|im_start|>assistant\n") or text[:a + 1].endswith("<|im_start|>assistant\n")
            assert (m.get("content") or "") in text[a:b] and text[a:b].endswith("<|im_end|>\n")
            assert all(c["function"]["name"] in text[a:b] for c in m.get("tool_calls", []))
        not_nfc += not unicodedata.is_normalized("NFC", text)
    assert model.encoders["gigatoken"].by_reference == not_nfc > 0


def test_named_templates_pick_tool_use_with_tools(models):
    """A list of named templates: "tool_use" (with generation blocks) for conversations with tools,
    "default" for the others, as transformers picks; masks are transformers' on both engines."""
    model, rng = models["named"], random.Random(5)
    assert model.template.named and model.template.has_generation_for(tools=[])
    for i in range(N // 2):
        tools = TOOLS if i % 2 else None
        messages = random_conversation(rng, tools=tools is not None)
        text, ref = transformers_answer(model, messages, tools)
        ours_text, _, got = _ours(model, messages, tools)
        assert ours_text == text and (("# Tools" in text) == (tools is not None))
        for engine, (ids, mask, _) in got.items():
            assert ids.tolist() == ref["input_ids"] and mask.astype(int).tolist() == ref["assistant_masks"], engine


def test_last_completion_and_all_rules(models):
    model = models["llama3"]
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "the quick"},
                {"role": "user", "content": "fox"}, {"role": "assistant", "content": " 東京 "}]
    text, spans = rendered(model.template, Conversation(messages, None, None), train_on="assistant")
    assert [text[a:b] for a, b in spans] == ["the quick<|eot_id|>", "東京<|eot_id|>"]
    assert rendered(model.template, Conversation(messages, None, None), train_on="last")[1] == spans[-1:]
    assert rendered(model.template, Conversation(messages, None, None), train_on="all")[1] == [(0, len(text))]
    with pytest.raises(ValueError, match="pairs"):
        rendered(model.template, Conversation(messages, None, None), train_on="completion")

    chatml = models["chatml"]
    conv = conversation_of({"q": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
                                  {"role": "user", "content": "more"}], "a": "the answer"},
                           ChatFields(prompt="q", completion="a"))
    assert conv.prompt_messages == 3 and conv.messages[-1] == {"role": "assistant", "content": "the answer"}
    text, spans = rendered(chatml.template, conv, train_on="completion")
    assert [text[a:b] for a, b in spans] == ["the answer<|im_end|>\n"]  # TRL: after the generation prompt
    assert [text[a:b] for a, b in rendered(chatml.template, conv, train_on="assistant")[1]] == [
        "a<|im_end|>\n", "the answer<|im_end|>\n"]
    assert [text[a:b] for a, b in rendered(chatml.template, conv, train_on="last")[1]] == ["the answer<|im_end|>\n"]
    pair = conversation_of({"p": "say hi", "c": "hi"}, ChatFields(prompt="p", completion="c"))
    assert pair.messages == [{"role": "user", "content": "say hi"}, {"role": "assistant", "content": "hi"}]


def test_a_template_that_rewrites_earlier_turns_needs_generation_blocks(models):
    """Dropping the reasoning of all but the last turn (as Qwen3 does): no turn-by-turn reading."""
    source = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and not loop.last %}"
              "{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    conv = Conversation([{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>x</think>a"},
                         {"role": "user", "content": "q2"}, {"role": "assistant", "content": "b"}], None, None)
    with pytest.raises(ChatError, match="turn by turn"):
        rendered(ChatTemplate(source=source), conv, train_on="assistant")
    assert rendered(ChatTemplate(source=source), conv, train_on="all")[1]


# ---------------------------------------------------------------------------------------------
# the gigatoken engine equals the reference on adversarial text


def _same_encoding(hf: ChatEncoder, giga: ChatEncoder, text: str, extra=()) -> None:
    """Equal ids, and equal masks for a span over each character and an empty span at each point:
    masks that tell every token's offsets apart."""
    spans = [*extra, *([(i, i)] for i in range(len(text) + 1)), *([(i, i + 1)] for i in range(len(text)))]
    a, b = hf.encode([text] * len(spans), spans), giga.encode([text] * len(spans), spans)
    for x, y in zip(a, b):
        assert np.array_equal(x, y), text


VARIANTS = [(trim, prefix, nfc) for trim in (True, False) for prefix in (True, False) for nfc in (True, False)]


@pytest.fixture(scope="module")
def trim_variants() -> dict[tuple[bool, bool, bool], tuple[ChatEncoder, ChatEncoder]]:
    """trim_offsets, add_prefix_space (pre-tokenizer and post-processor), an NFC normalizer: all with
    an added token that strips the spaces before it."""
    out = {}
    for trim, prefix, nfc in VARIANTS:
        js = tokenizer_json(kind="gpt2", trim_offsets=trim, add_prefix_space=prefix, nfc=nfc)
        out[trim, prefix, nfc] = (ChatEncoder(tokenizer_json=js, engine="hf"),
                                  ChatEncoder(tokenizer_json=js, engine="gigatoken"))
    return out


_adversarial = st.lists(st.one_of(st.sampled_from([*PIECES, "<mask>", " <mask>", "\u3000<mask>", "Ġ<mask> "]),
                                  st.text(max_size=3)), max_size=30).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_adversarial, cuts=st.lists(st.integers(0, 400), max_size=8), variant=st.sampled_from(VARIANTS))
def test_gigatoken_engine_equals_the_reference(trim_variants, text, cuts, variant):
    """Ids and masks of both engines equal on adversarial text (texts the byte table cannot prove
    go to tokenizers: the equality holds either way; the seeded tests above check that the table
    is what answers for ordinary text)."""
    hf, giga = trim_variants[variant]
    cuts = sorted(c % (len(text) + 1) for c in cuts)
    _same_encoding(hf, giga, text, extra=[list(zip(cuts[::2], cuts[1::2]))])
    assert giga.derives_offsets


CRAFTED = ["x <mask>", "Ġ <mask>", "a <mask> b <mask>", "日本 <mask>", " <mask>", "<mask>", "x\u3000<mask>",
           "e\u0301 <mask>", "x <mask> y", "  x  ", "\u3000x\u3000", "🤖", " 🤖 ", "Ġx", "ĠĠ", "\n\n \n", ""]


@pytest.mark.parametrize("variant", VARIANTS)
def test_gigatoken_engine_equals_the_reference_on_crafted_text(trim_variants, variant):
    """Where counting bytes could mislead: a prefix space added (+1 byte) where an added token took
    a space (-1 byte): the counts agree and yet the offsets would not, so such a tokenizer checks
    by decoding."""
    hf, giga = trim_variants[variant]
    for text in CRAFTED:
        _same_encoding(hf, giga, text)


def _transformers_walk(offsets, spans) -> list[int]:
    """transformers' loop in apply_chat_template, as written there."""
    mask, at = [0] * len(offsets), 0
    for i, (start, end) in enumerate(offsets):
        while at < len(spans) and start >= spans[at][1]:
            at += 1
        if at == len(spans):
            break
        if end > spans[at][0]:
            mask[i] = 1
    return mask


@settings(max_examples=400, deadline=None)
@given(tokens=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 6)), max_size=30),
       spans=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 10)), max_size=6), ordered=st.booleans())
def test_mask_from_offsets_is_transformers_walk(tokens, spans, ordered):
    """Any offsets (trimmed ones go back, empty ones), any spans (empty, overlapping, out of order)."""
    offsets = [(s, s + n) for s, n in (sorted(tokens) if ordered else tokens)]
    spans = [(s, s + n) for s, n in (sorted(spans) if ordered else spans)]
    got = mask_from_offsets(np.array(offsets, dtype=np.int64).reshape(-1, 2), spans)
    assert got.astype(int).tolist() == _transformers_walk(offsets, spans)


# ---------------------------------------------------------------------------------------------
# bad records, bad templates, loading


def test_bad_records_are_chat_errors():
    fields = ChatFields()
    with pytest.raises(ChatError, match="JSON object"):
        conversation_of(["not", "an", "object"], fields)
    with pytest.raises(ChatError, match=r"no 'messages' field \(it has 'text', 'id'\)"):
        conversation_of({"text": "x", "id": 1}, fields)
    with pytest.raises(ChatError, match="not JSON"):
        conversation_of({"messages": "hello"}, fields)
    with pytest.raises(ChatError, match="not a list"):
        conversation_of({"messages": {"role": "user"}}, fields)
    with pytest.raises(ChatError, match="unknown role 'robot'"):
        conversation_of({"messages": [{"role": "robot", "content": "beep"}]}, fields)
    with pytest.raises(ChatError, match="not an object"):
        conversation_of({"messages": [["user", "hi"]]}, fields)
    with pytest.raises(ChatError, match="no \"content\""):
        conversation_of({"messages": [{"role": "user"}]}, fields)
    with pytest.raises(ChatError, match="empty conversation"):
        conversation_of({"messages": []}, fields)
    with pytest.raises(ChatError, match="tool objects"):
        conversation_of({"messages": [{"role": "user", "content": "x"}], "tools": [1]}, fields)
    with pytest.raises(ChatError, match=r"no 'answer' field"):
        conversation_of({"question": "x"}, ChatFields(prompt="question", completion="answer"))
    as_string = conversation_of({"messages": [{"role": "user", "content": "x"}], "tools": json.dumps(TOOLS)}, fields)
    assert as_string.tools == TOOLS


def test_template_failures_are_chat_errors(models):
    llama = models["llama3"].template
    with pytest.raises(ChatError, match="refused it: Conversation roles must be user or assistant"):
        rendered(llama, conversation_of({"messages": [{"role": "tool", "content": "x"}]}, ChatFields()),
                 train_on="all")
    broken = ChatTemplate(source="{{ messages[0].content.nope() }}")
    with pytest.raises(ChatError, match="failed on it"):
        broken.render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatError, match="failed on it"):
        ChatTemplate(source="{{ 1 / 0 }}").render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize("escape", ["{{ ''.__class__.__mro__[1].__subclasses__() }}",
                                    "{{ messages.__class__.__init__.__globals__ }}",
                                    "{{ cycler.__init__.__globals__['os'] }}",
                                    "{% set ns = namespace() %}{% set ns._x = 1 %}{{ ns }}",
                                    "{{ namespace(_y=1) }}", "{{ messages.append(1) }}",
                                    "{{ dict.__class__.__base__.__subclasses__() }}",
                                    "{{ '{0.__class__.__mro__}'.format(1) }}", "{{ raise_exception.__globals__.keys() }}"])
def test_the_sandbox_refuses_escapes(escape):
    with pytest.raises(ChatError, match="SecurityError|UndefinedError"):
        ChatTemplate(source=escape).render([{"role": "user", "content": "x"}])


def test_unsafe_attributes_print_as_nothing_as_in_transformers(models):
    """An unsafe attribute only looked at is Jinja's undefined: it prints nothing, for transformers too."""
    for source in ["[{{ ''.__class__ }}]", "[{{ dict.__class__ }}]", "[{{ raise_exception.__globals__ }}]"]:
        assert ChatTemplate(source=source).render([{"role": "user", "content": "x"}]) == ("[]", [])
        ref = models["chatml"].reference
        assert ref.apply_chat_template([{"role": "user", "content": "x"}], chat_template=source, tokenize=False) == "[]"


def test_rendering_prepares_messages_as_transformers(models):
    """None values dropped (no "None" in the text), reasoning aliased, special tokens passed."""
    source = ("{{ bos_token }}{% for m in messages %}{{ m.role }}|{{ m.reasoning_content }}|{{ m.thinking }}|"
              "{{ m.get('content', 'absent') }};{% endfor %}{{ tools | tojson }}")
    template = ChatTemplate(source=source, variables={"bos_token": "<s>"})
    messages = [{"role": "user", "content": None}, {"role": "assistant", "content": "é", "reasoning": "hm"}]
    text, _ = template.render(messages, tools=[{"name": "f", "d": "ü<"}])
    assert text == '<s>user|||absent;assistant|hm|hm|é;[{"name": "f", "d": "ü<"}]'
    folder = model_folder(Path(pytest.importorskip("tempfile").mkdtemp()), tokenizer_json(kind="gpt2"), source,
                     bos_token="<s>")
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    assert ref.apply_chat_template(messages, tools=[{"name": "f", "d": "ü<"}], tokenize=False) == text


def test_load_chat_template_usage_errors(tmp_path, tokenizers_json):
    js = tokenizers_json["gpt2"]
    bare = model_folder(tmp_path / "bare", js, None)
    with pytest.raises(UsageError, match="no chat template.*--chat-template FILE"):
        load_chat_template(tokenizer=bare / "tokenizer.json", template_file=None)
    broken = model_folder(tmp_path / "broken", js, "{% for m in messages %}{{ m.content }")
    with pytest.raises(UsageError, match=r"tokenizer_config.json: the chat template does not compile \(line 1"):
        load_chat_template(tokenizer=broken / "tokenizer.json", template_file=None)
    with pytest.raises(UsageError, match="missing.jinja: no such file"):
        load_chat_template(tokenizer=bare / "tokenizer.json", template_file=tmp_path / "missing.jinja")
    (tmp_path / "bad.jinja").write_text("{% if %}", encoding="utf-8")
    with pytest.raises(UsageError, match="bad.jinja: the chat template does not compile"):
        load_chat_template(tokenizer=bare / "tokenizer.json", template_file=tmp_path / "bad.jinja")
    (tmp_path / "bare" / "tokenizer_config.json").write_text("{nope", encoding="utf-8")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_chat_template(tokenizer=bare, template_file=None)


def test_where_templates_and_special_tokens_come_from(tmp_path, tokenizers_json):
    """--chat-template wins; chat_template.jinja beside the tokenizer wins over the config's; the
    variables are transformers' special_tokens_map (AddedToken dicts as their content, model-specific
    *_token strings too); a ChatTemplate pickles without its compiled form."""
    folder = model_folder(tmp_path / "m", tokenizers_json["gpt2"], "config {{ eos_token }}",
                     eos_token={"__type": "AddedToken", "content": "<|im_end|>", "special": True},
                     image_token="<|endoftext|>", add_bos_token=False)
    got = load_chat_template(tokenizer=folder / "tokenizer.json", template_file=None)
    assert got.render([{"role": "user", "content": "x"}])[0] == "config <|im_end|>"
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    assert got.variables == ref.special_tokens_map == {"eos_token": "<|im_end|>", "image_token": "<|endoftext|>"}
    (folder / "chat_template.jinja").write_text("file {{ image_token }}", encoding="utf-8")
    got = load_chat_template(tokenizer=folder, template_file=None)
    assert got.render([{"role": "user", "content": "x"}])[0] == "file <|endoftext|>"
    assert transformers.AutoTokenizer.from_pretrained(folder).chat_template == "file {{ image_token }}"
    (tmp_path / "mine.jinja").write_text("mine {% generation %}{{ messages[0].content }}{% endgeneration %}")
    mine = load_chat_template(tokenizer=folder / "tokenizer.json", template_file=tmp_path / "mine.jinja")
    assert mine.has_generation and mine.render([{"role": "user", "content": "x"}]) == ("mine x", [(5, 6)])
    again = pickle.loads(pickle.dumps(mine))
    assert again.render([{"role": "user", "content": "x"}]) == ("mine x", [(5, 6)]) and again.sha256 == mine.sha256


def test_last_is_the_last_assistant_message_even_across_several_blocks():
    """A template writing an assistant's content and its end of turn in two blocks: ``last`` keeps
    both blocks of the last assistant message, and none of the earlier ones'."""
    two = ("{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
           "{% endgeneration %}{% generation %}</end>{% endgeneration %}{% else %}{{ m.content }}{% endif %}"
           "{% endfor %}")
    template = ChatTemplate(source=two)
    conv = conversation_of({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                         {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]},
                           ChatFields())
    text, spans = rendered(template, conv, train_on="last")
    assert [text[a:b] for a, b in spans] == ["d", "</end>"]
    text, spans = rendered(template, conv, train_on="assistant")
    assert [text[a:b] for a, b in spans] == ["b", "</end>", "d", "</end>"]
    no_assistant = conversation_of({"messages": [{"role": "user", "content": "a"}]}, ChatFields())
    assert rendered(template, no_assistant, train_on="last")[1] == []


def test_messages_kept_as_a_json_string_and_oversized_conversations():
    got = conversation_of({"messages": json.dumps([{"role": "user", "content": "hi"}])}, ChatFields())
    assert got.messages == [{"role": "user", "content": "hi"}]
    with pytest.raises(ChatError, match="not JSON"):
        conversation_of({"messages": "[{"}, ChatFields())
    from shardsmith.text.chat import MAX_CHARS

    with pytest.raises(ChatError, match="characters of content"):
        conversation_of({"messages": [{"role": "user", "content": "x" * (MAX_CHARS + 1)}]}, ChatFields())
