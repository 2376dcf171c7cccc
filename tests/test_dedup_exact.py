"""pack-tokens --dedup exact / exact:raw and --removed: the first occurrence in input order stays,
the same documents go (and the same bytes come out) for any workers, memory, stages or packing."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import make_docs, run_cli, tree_digest, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_pack_tokens import documents, reference_ids

from shardsmith.engine.shuffle.duplicates import _exact
from shardsmith.kit.keys import input_order, shuffle_keys
from shardsmith.text.textnorm import normalize


def planted(root: Path, *, seed: int = 0, n: int = 400) -> tuple[list[tuple[str, str]], list[str]]:
    """Three files of documents, about a quarter of them copies of an earlier one (verbatim, in
    upper case, or with whitespace changed). Returns (file, text) per document in input order."""
    rng = random.Random(seed)
    base = make_docs(n, seed=seed)
    names = ["a.jsonl", "b/c.jsonl", "d.jsonl"]
    files: dict[str, list[str]] = {name: [] for name in names}
    order: list[tuple[str, str]] = []
    for name in names:
        for _ in range(n // 3):
            if order and rng.random() < 0.25:
                _, text = rng.choice(order)
                text = rng.choice([text, text.upper(), "  " + text.replace(" ", " \n\t ") + " \n"])
            else:
                text = base.pop()
            files[name].append(text)
            order.append((name, text))
    for name, texts in files.items():
        write_jsonl(root / name, texts)
    return order, names


def expected_dropped(order: list[tuple[str, str]], *, raw: bool = False) -> list[tuple[int, int]]:
    """Indexes (into ``order``) of each dropped document and of the first one it repeats."""
    first: dict[str, int] = {}
    out = []
    for i, (_, text) in enumerate(order):
        key = text if raw else normalize(text)
        if key in first:
            out.append((i, first[key]))
        else:
            first[key] = i
    return out


def pack(root: Path, out: Path, tok: Path, *extra: str) -> dict:
    res = run_cli("pack-tokens", root, "-o", out, "--tokenizer", tok, "--quiet", *extra)
    assert res.exit_code == 0, res.stderr
    return json.loads((out / "manifest.json").read_text())


def staged_pack(root: Path, out: Path, tok: Path, *extra: str | Path, world: int = 3) -> None:
    """pack-tokens as cluster stages: every scatter rank, the plan, every gather rank, finalize."""
    common = ("pack-tokens", root, "--tokenizer", tok, "-o", out, "-q", *extra, "--memory", "300KB")
    for stage in ("scatter", "plan", "gather"):  # (plan ranks but 0: nothing to do)
        for rank in range(world):
            res = run_cli(*common, "--stage", stage, "--rank", str(rank), "--world-size", str(world))
            assert res.exit_code == 0, res.stderr
    res = run_cli(*common, "--stage", "finalize", "--world-size", str(world))
    assert res.exit_code == 0, res.stderr


def _line_of(order: list[tuple[str, str]], i: int) -> tuple[str, int]:
    name = order[i][0]
    return name, sum(1 for f, _ in order[:i] if f == name)


def test_exact_drops_normalized_repeats_and_keeps_the_first(tmp_path, bpe_tokenizer):
    order, _ = planted(tmp_path / "in")
    gone = expected_dropped(order)
    assert 50 < len(gone) < 200
    m = pack(tmp_path / "in", tmp_path / "out", bpe_tokenizer, "--dedup", "exact", "--removed", tmp_path / "rm.jsonl",
             "--seed", "3")
    kept = [i for i in range(len(order)) if i not in {g for g, _ in gone}]
    ids = reference_ids(bpe_tokenizer, [order[i][1] for i in range(len(order))])
    ident = [_line_of(order, i) for i in range(len(order))]
    key = {i: int(shuffle_keys(3, ident[i][0], np.array([ident[i][1]]))[0]) for i in kept}
    assert documents(tmp_path / "out") == [ids[i] for i in sorted(kept, key=key.__getitem__)]
    c = m["cleaning"]
    assert c["dedup"] == {"rule": "exact", "documents": len(gone), "tokens": sum(len(ids[g]) for g, _ in gone)}
    assert c["removed"]["documents"] == len(gone)
    assert m["source"]["records"] == len(order)
    lines = [json.loads(x) for x in (tmp_path / "rm.jsonl").read_text().splitlines()]
    want = []
    for g, f in gone:
        (gf, gl), (ff, fl) = ident[g], ident[f]
        want.append({"file": gf, "record": gl, "line": gl + 1, "rule": "exact",
                     "duplicate_of": {"file": ff, "record": fl, "line": fl + 1}})
    assert lines == want


def test_raw_keeps_changed_case_and_whitespace(tmp_path, bpe_tokenizer):
    order, _ = planted(tmp_path / "in", seed=1)
    gone = expected_dropped(order, raw=True)
    assert len(gone) < len(expected_dropped(order))
    m = pack(tmp_path / "in", tmp_path / "out", bpe_tokenizer, "--dedup", "exact:raw")
    assert m["cleaning"]["dedup"]["documents"] == len(gone)
    assert m["splits"]["train"]["samples"] == len(order) - len(gone)


def test_same_bytes_for_any_workers_memory_and_stages(tmp_path, bpe_tokenizer):
    planted(tmp_path / "in", seed=2, n=900)
    args = ("--dedup", "exact", "--split", "train=0.8,val=0.2")
    one = pack(tmp_path / "in", tmp_path / "one", bpe_tokenizer, *args)
    pack(tmp_path / "in", tmp_path / "many", bpe_tokenizer, *args, "--workers", "2", "--memory", "200KB")
    assert tree_digest(tmp_path / "one") == tree_digest(tmp_path / "many")
    out = tmp_path / "staged"
    staged_pack(tmp_path / "in", out, bpe_tokenizer, *args)
    assert tree_digest(out) == tree_digest(tmp_path / "one")
    staged = json.loads((out / "manifest.json").read_text())
    assert staged["cleaning"] == one["cleaning"] and one["cleaning"]["dedup"]["documents"] > 100


def test_packed_best_fit_and_unshuffled_runs_leave_the_same_documents_out(tmp_path, bpe_tokenizer):
    order, _ = planted(tmp_path / "in", seed=4)
    gone = {g for g, _ in expected_dropped(order)}
    kept = [order[i][1] for i in range(len(order)) if i not in gone]
    pack(tmp_path / "in", tmp_path / "plain", bpe_tokenizer, "--dedup", "exact", "--no-shuffle")
    assert documents(tmp_path / "plain") == reference_ids(bpe_tokenizer, kept)
    m = pack(tmp_path / "in", tmp_path / "packed", bpe_tokenizer, "--dedup", "exact", "--pack", "best-fit",
             "--seq-len", "64", "--workers", "2")
    assert m["packing"]["documents"] == len(kept)
    assert m["cleaning"]["dedup"]["documents"] == len(gone)


def test_removed_needs_a_rule_and_dedup_names_its_choices(tmp_path, bpe_tokenizer):
    planted(tmp_path / "in", n=30)
    res = run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer, "-q",
                  "--removed", tmp_path / "r.jsonl")
    assert res.exit_code == 2 and "--removed lists what --dedup and --decontaminate drop" in res.stderr
    assert "Traceback" not in res.stderr
    res = run_cli("pack-tokens", tmp_path / "in", "-o", tmp_path / "o", "--tokenizer", bpe_tokenizer, "-q",
                  "--dedup", "fuzzy")
    assert res.exit_code == 2 and "exact" in res.stderr


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.sampled_from(["a b", "A  b", "c", "a b ", "d e f", "D E F", "x"]), min_size=1, max_size=60),
       cuts=st.lists(st.integers(0, 60), max_size=4), memory=st.sampled_from([1, 4096, 1 << 30]))
def test_exact_keeps_the_first_of_each_normalized_text_in_any_partitioning(tmp_path_factory, texts, cuts, memory):
    """The decision over facts written as tasks of any sizes, in any number of hash partitions."""
    from shardsmith.engine.shuffle.doc_facts import BASE, facts_path
    from shardsmith.text.textnorm import doc_hashes

    work = tmp_path_factory.mktemp("facts")
    bounds = sorted({0, len(texts), *(c for c in cuts if c < len(texts))})
    for t, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        base = np.zeros(b - a, BASE)
        base["order"] = input_order(0, np.arange(a, b))
        base["length"] = base["nbytes"] = 1
        facts_path(work, t, "base").parent.mkdir(exist_ok=True)
        np.save(facts_path(work, t, "base"), base)
        np.save(facts_path(work, t, "hash"), doc_hashes(texts[a:b]))
    rows = _exact(work, list(range(len(bounds) - 1)), memory)
    got = sorted(zip(rows["order"].tolist(), rows["kept"].tolist()))
    first: dict[str, int] = {}
    want = []
    for i, text in enumerate(texts):
        k = normalize(text)
        if k in first:
            want.append((i, first[k]))
        else:
            first[k] = i
    assert got == want


@pytest.mark.parametrize("text,same", [("Hello,\u00a0 WORLD\n", "hello, world"), ("ﬁne\tΣΑΣ", "fine σασ"),
                                       ("  x  ", "x"), ("", "")])
def test_normalization_is_nfkc_casefold_and_single_spaces(text, same):
    assert normalize(text) == same == " ".join(__import__("unicodedata").normalize("NFKC", text).casefold().split())


def test_convert_rows_to_tar_drops_the_same_documents(tmp_path):
    """``convert --to webdataset --text-field`` compares the text member: the kept samples are the
    first occurrences, in the same shuffle order as without dedup."""
    import tarfile

    order, _ = planted(tmp_path / "in", seed=5, n=150)
    gone = {g for g, _ in expected_dropped(order)}
    base = ("convert", tmp_path / "in", "--to", "webdataset", "--text-field", "text", "-q")
    res = run_cli(*base, "-o", tmp_path / "all")
    assert res.exit_code == 0, res.stderr
    res = run_cli(*base, "-o", tmp_path / "dd", "--dedup", "exact", "--removed", tmp_path / "rm.jsonl")
    assert res.exit_code == 0, res.stderr
    assert f"--dedup exact dropped {len(gone)} documents" in res.output

    def keys(out: Path) -> list[tuple[str, int]]:
        got = []
        for shard in sorted(out.glob("*.tar")):
            with tarfile.open(shard) as tf:
                got += [m.name for m in tf.getmembers() if m.name.endswith(".txt")]
        return [(k.rsplit("-r", 1)[0], int(k.rsplit("-r", 1)[1].split("-")[0])) for k in got]

    dropped = {(order[g][0].replace(".", "_").replace("/", "_"), _line_of(order, g)[1]) for g in gone}
    assert keys(tmp_path / "dd") == [k for k in keys(tmp_path / "all") if k not in dropped]
    assert len((tmp_path / "rm.jsonl").read_text().splitlines()) == len(gone)
    res = run_cli("convert", tmp_path / "in", "--to", "webdataset", "-o", tmp_path / "x", "-q", "--dedup", "exact")
    assert res.exit_code == 2 and "give --text-field" in res.stderr


def test_inspect_and_the_report_show_what_was_dropped(tmp_path, bpe_tokenizer):
    order, _ = planted(tmp_path / "in", seed=7, n=120)
    n = len(expected_dropped(order))
    pack(tmp_path / "in", tmp_path / "out", bpe_tokenizer, "--dedup", "exact")
    res = run_cli("inspect", tmp_path / "out", "--samples", "0")
    assert res.exit_code == 0 and f"cleaning: --dedup exact dropped {n} documents" in res.output
    res = run_cli("inspect", tmp_path / "out", "--json", "--samples", "0")
    assert json.loads(res.output)["cleaning"]["dedup"]["documents"] == n
    pytest.importorskip("matplotlib")
    res = run_cli("inspect", tmp_path / "out", "--report", tmp_path / "rep")
    assert res.exit_code == 0, res.stderr
    html = (tmp_path / "rep" / "report.html").read_text()
    assert "Documents dropped" in html and f"<td>--dedup exact</td><td></td><td>{n}</td>" in html


@settings(max_examples=500, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
       | st.lists(st.sampled_from([" ", "\u00a0", "\u2028", "\x85", "\u3000", "\t\n", "A", "ß", "ﬁ", "\u1fbd", "x"]),
                  max_size=12).map("".join))
def test_normalize_equals_its_definition(text):
    import unicodedata

    assert normalize(text) == " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def test_every_space_the_fast_path_must_know():
    """After NFKC and case folding, the only whitespace besides " " is what ``_SPACES`` lists."""
    import sys
    import unicodedata

    from shardsmith.text.textnorm import _SPACES

    left = {ch for c in range(sys.maxunicode + 1) if chr(c).isspace()
            for ch in unicodedata.normalize("NFKC", chr(c)).casefold() if ch.isspace() and ch != " "}
    assert left == set(_SPACES)


@pytest.mark.parametrize("option", [("--dedup", "exact"), ("--removed", "r.jsonl")])
def test_cleaning_options_a_command_cannot_take_are_refused_not_ignored(tmp_path, option):
    """Events have no text: --dedup is refused in one line (it was ignored), as --removed without a rule."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"event_id": pa.array([1, 1, 2], pa.int64()), "t": pa.array([0.5, 1.5, 2.5], pa.float32())}),
                   tmp_path / "in" / "e.parquet")
    res = run_cli("convert", tmp_path / "in", "-o", tmp_path / "out", "--to", "hdf5", "--group-by", "event_id", "-q",
                  *option)
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res.stderr
    assert "--dedup and --decontaminate" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "manifest.json").exists()
