"""``convert --to tokens --chat`` is ``pack-tokens --chat``: the same files, manifests included (all
but the time and the command line as typed), and the same one-line refusals; the chat options are
the tokens format's, refused with another ``--to``; and pack-tokens' flags are the tokens format's
declaration (one table: ``formats/tokens/options.py``), which they cannot drift from."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import click
import pytest
from conftest import make_docs, run_cli, tree_digest
from test_convert_tokens import card_of, manifest_of, one_line

from shardsmith.cli import main
from shardsmith.commands.pack_tokens import PackTokensOptions
from shardsmith.formats.tokens import options as declared

# a Jinja chat template with generation blocks: any tokenizer renders it (tests/test_chat_pack.py)
TEMPLATE = ("{% for m in messages %}{{ m.role }}: {% generation %}{{ m.content }}{% endgeneration %}\n"
            "{% endfor %}")


@pytest.fixture
def chats(tmp_path: Path) -> tuple[Path, Path]:
    """A JSONL of 60 conversations (each also a prompt/completion pair) and a chat template file."""
    docs = make_docs(180, seed=5)
    rows = [{"messages": [{"role": "user", "content": docs[i]}, {"role": "assistant", "content": docs[i + 1]},
                          {"role": "user", "content": docs[i + 2]}, {"role": "assistant", "content": docs[i + 1]}],
             "prompt": docs[i], "completion": docs[i + 2]} for i in range(0, 180, 3)]
    inp = tmp_path / "chat" / "c.jsonl"
    inp.parent.mkdir()
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    return inp.parent, template


@pytest.mark.parametrize("extra", [
    ["--seed", "2", "--split", "train=0.8,val=0.2"],
    ["--pack", "best-fit", "--seq-len", "48", "--too-long", "split", "--train-on", "last", "--pack-window", "1K"],
    ["--prompt-field", "prompt", "--completion-field", "completion", "--train-on", "completion", "--provenance",
     "--pack", "best-fit", "--seq-len", "120", "--too-long", "drop"],
], ids=["messages", "packed-split", "pairs-dropped"])
def test_convert_to_tokens_chat_writes_what_pack_tokens_chat_writes(chats, bpe_tokenizer, tmp_path, extra):
    inp, template = chats
    out = tmp_path / "out"  # one output path for both: the run's identity names it
    made, lines = {}, {}
    for command in (["pack-tokens"], ["convert", "--to", "tokens"]):
        res = run_cli(*command, inp, "--tokenizer", bpe_tokenizer, "--chat", "--chat-template", template, *extra,
                      "--workers", "1", "-q", "-o", out)
        assert res.exit_code == 0, res.stderr
        lines[command[0]] = res.output
        made[command[0]] = Path(shutil.move(out, tmp_path / command[0]))
    pack, convert = made["pack-tokens"], made["convert"]
    assert tree_digest(pack) == tree_digest(convert)  # every file but the manifest and the card, byte for byte
    assert manifest_of(pack) == manifest_of(convert)  # the run identity too: one job
    assert card_of(pack) == card_of(convert)
    assert lines["pack-tokens"] == lines["convert"] and "--chat:" in lines["convert"]
    chat = manifest_of(convert)["chat"]
    assert chat["conversations"] > 0 and 0 < chat["trained_tokens"] < chat["tokens"]
    assert "loss_mask" in manifest_of(convert)["schema"] and "format_options" not in manifest_of(convert)


@pytest.mark.parametrize(("args", "says"), [
    (["--train-on", "all"], "--train-on reads conversations: give --chat too"),
    (["--chat", "--nanogpt"], "--chat: --nanogpt does not apply"),
    (["--chat", "--too-long", "drop"], "give --pack best-fit --seq-len N too"),
    (["--chat", "--prompt-field", "prompt"], "--prompt-field and --completion-field name the two halves"),
])
def test_chat_options_that_contradict_are_the_same_line_through_both_commands(chats, bpe_tokenizer, tmp_path,
                                                                                 args, says):
    inp, template = chats
    chat = ("--chat-template", template) if "--chat" in args else ()
    common = (inp, "--tokenizer", bpe_tokenizer, *chat, *args, "-q", "-o", tmp_path / "out")
    pack = one_line(run_cli("pack-tokens", *common), 2)
    assert says in pack
    assert one_line(run_cli("convert", "--to", "tokens", *common), 2) == pack
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_chat_with_images_or_another_format_is_one_line(chats, bpe_tokenizer, tmp_path):
    inp, template = chats
    images = tmp_path / "images" / "cat"
    images.mkdir(parents=True)
    (images / "a.jpg").write_bytes(b"\xff\xd8\xff\xd9")
    chat = ["--chat", "--chat-template", template]
    cases = [
        ([tmp_path / "images", "--to", "tokens", "--tokenizer", bpe_tokenizer, *chat], "no input files"),
        ([tmp_path / "images", "--to", "tokens", "--from", "imagefolder", "--tokenizer", bpe_tokenizer, *chat],
         "--from does not apply to --to tokens"),
        ([inp, "--to", "tokens", "--tokenizer", bpe_tokenizer, *chat, "--augment", "hflip"],
         "--augment does not apply to --to tokens"),
        ([inp, "--to", "parquet", "--chat"], "--chat applies to --to tokens only, not to --to parquet"),
        ([inp, "--to", "webdataset", "--messages-field", "m"], "--messages-field applies to --to tokens only"),
        ([tmp_path / "images", "--to", "webdataset", "--chat-template", template],
         "--chat-template applies to --to tokens only"),
    ]
    for args, says in cases:
        assert says in one_line(run_cli("convert", *args, "-q", "-o", tmp_path / "out"), 2), args
        assert not (tmp_path / "out" / "manifest.json").exists()


# -- one table: pack-tokens' flags are the tokens format's declared options ---------------------------

def _params(name: str) -> dict[str, click.Parameter]:
    command = main.commands[name]
    with click.Context(command, info_name=name) as ctx:
        return {p.name: p for p in command.get_params(ctx) if p.name}


def _described(p: click.Parameter) -> tuple[Any, ...]:
    """What a user sees of an option and what click checks: flags, metavar, type and range, default, help."""
    kind = p.type
    bounds = (getattr(kind, "min", None), getattr(kind, "max", None), tuple(getattr(kind, "choices", ()) or ()))
    return (tuple(p.opts), p.metavar, type(kind).__name__, bounds, p.default, getattr(p, "help", None),
            getattr(p, "is_flag", False), getattr(p, "show_default", None), p.callback is not None)


def test_pack_tokens_options_are_the_tokens_format_s_declaration():
    pack, convert = _params("pack-tokens"), _params("convert")
    own = {p.name for p in click.Command.get_params(main.commands["convert"], click.Context(main.commands["convert"]))}
    table = {o.name: o for o in declared.PACK_TOKENS}
    assert set(declared.OPTIONS.names()) | {"text_field"} == set(table)
    for name, o in table.items():
        p = pack[name]
        assert p.opts == [o.flag] and p.default == (False if o.type == "flag" else o.default), name
        assert p.help == o.help, name
        if o.type in ("int", "float"):
            assert (p.type.min, p.type.max) == (o.low, o.high), name
        if o.choices:
            assert tuple(p.type.choices) == o.choices, name
        # convert takes it as the same option: a declared one (the format's), or its own (--provenance,
        # --text-field: the command's flag is the format's)
        if name not in own:
            assert _described(convert[name]) == _described(p), name
    # nothing pack-tokens takes that convert --to tokens does not: every flag beyond convert's own is declared
    assert set(pack) - own <= set(declared.OPTIONS.names())
    # the Python API's defaults are the command line's
    fields = {f.name: f.default for f in dataclasses.fields(PackTokensOptions)}
    for name, o in table.items():
        assert fields[name] == o.default_value(), name


def test_the_declared_chat_choices_are_the_chat_module_s():
    from shardsmith.text.chat import TRAIN_ON

    assert declared.TRAIN_ON == TRAIN_ON


def test_convert_help_lists_the_chat_options_under_to_tokens():
    res = run_cli("convert", "--help")
    assert res.exit_code == 0 and "warning" not in res.stderr, res.stderr
    section = res.output.split("Options for --to tokens:")[1].split("Options for --to webdataset")[0]
    for o in declared.CHAT:
        assert o.flag in section
    pack = run_cli("pack-tokens", "--help")
    for o in declared.PACK_TOKENS:
        assert o.flag in pack.output
