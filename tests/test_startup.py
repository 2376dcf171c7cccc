"""Start-up stays light (issue 18): a cluster run starts 2W+1 processes where a local run starts one,
so what every process imports before it works is paid 2W+1 times. Checked on ``sys.modules`` of a
fresh interpreter, not on time (which a loaded machine makes meaningless)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import root_data, same_dataset

# what no command needs before it runs, and what --version and --help never need
HEAVY = ("numpy", "pyarrow", "h5py", "uproot", "awkward", "tokenizers", "gigatoken", "fsspec", "torch",
         "PIL", "orjson", "tqdm", "importlib.metadata")


def _imported(code: str) -> list[str]:
    """The modules of ``HEAVY`` a fresh interpreter holds after running ``code`` (then ``report()``)."""
    script = (f"import sys\ndef report(names={list(HEAVY)!r}):\n"
              "    print('\\n' + __import__('json').dumps([n for n in names if n in sys.modules]))\n"
              f"{code}\nreport()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cli(args: list[str]) -> str:
    """Run the command line in the interpreter (keeping it: ``main.main``, not the program's exit)."""
    return (f"from shardsmith.cli import main\ntry:\n    main.main({args!r}, standalone_mode=False)\n"
            "except SystemExit:\n    pass\n")


def test_importing_the_command_line_imports_nothing_heavy() -> None:
    assert _imported("import shardsmith.cli") == []


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["pack-tokens", "--help"], ["verify", "--help"]])
def test_version_and_help_import_nothing_heavy(args: list[str]) -> None:
    assert _imported(_cli(args)) == []


def test_convert_help_lists_every_format_s_options_importing_no_format() -> None:
    """``convert --help`` reads each format's options from its light module, a plugin's too (the
    example plugin's, registered as its entry points would register it): no format is imported, nor
    numpy, pyarrow, h5py or torch; only the scan of the installed packages' entry points."""
    assert [n for n in _imported(_cli(["convert", "--help"])) if n != "importlib.metadata"] == []
    plugin = Path(__file__).resolve().parents[1] / "examples/plugins/shardsmith-csv"
    code = (f"import sys\nsys.path.insert(0, {str(plugin)!r})\nfrom shardsmith import registry\n"
            "registry._installed = lambda: (registry.Plugin('format', 'csv', 'shardsmith_csv:CsvFormat',\n"
            "    origin='shardsmith-csv', options='shardsmith_csv.options:OPTIONS'),)\n"
            + _cli(["convert", "--help"]) +
            "print([m for m, mod in sys.modules.items() if m.startswith(('shardsmith.formats.', 'shardsmith_csv.'))"
            " and not m.endswith('.options') and not hasattr(mod, '__path__')])\n")  # (packages: docstrings)
    script = (f"import sys\n{code}\nprint(__import__('json').dumps([n for n in {list(HEAVY)!r} if n in sys.modules]))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    *help_lines, formats, heavy = done.stdout.strip().splitlines()
    assert formats == "[]" and json.loads(heavy) == ["importlib.metadata"], done.stdout[-500:]
    text = "\n".join(help_lines)
    assert "Options for --to csv:" in text and "--csv-delimiter [comma|tab]" in text, text


def test_later_stages_of_a_root_run_do_not_open_the_inputs(tmp_path: Path) -> None:
    """The scatter saves the ROOT schema in the run's scratch folder; gather and finalize take it from
    there instead of importing uproot and opening every input, and the dataset is the same bytes."""
    root = root_data() / "uproot-HZZ.root"
    args = ["convert", str(root), "--to", "hdf5", "--shard-samples", "700", "--workers", "1", "-q"]
    one, staged = tmp_path / "one", tmp_path / "staged"
    subprocess.run([sys.executable, "-m", "shardsmith", *args, "-o", str(one)], check=True, timeout=120)
    stage = [*args, "-o", str(staged), "--world-size", "2"]
    assert "uproot" in _imported(_cli([*stage, "--stage", "scatter", "--rank", "0"]))
    _imported(_cli([*stage, "--stage", "scatter", "--rank", "1"]))
    assert "uproot" not in _imported(_cli([*stage, "--stage", "plan", "--rank", "0"]))
    for rank in (0, 1):
        assert "uproot" not in _imported(_cli([*stage, "--stage", "gather", "--rank", str(rank)]))
    assert "uproot" not in _imported(_cli([*stage, "--stage", "finalize", "--rank", "0"]))
    same_dataset(one, staged)


def test_gigatoken_never_imports_awkward_in_the_check_or_in_a_worker(corpus, bpe_tokenizer, tmp_path: Path) -> None:
    """gigatoken's batch calls import awkward on first use (0.2-0.3 s, what the check used to wait
    for, and each cluster rank paid): the check, a run in one process and a forked worker of a run
    under BATCH_RUN_BYTES encode one document at a time instead (a larger run's spec asks for the
    batch call, ``batch_chars``: the import pays for itself there)."""
    root, docs = corpus
    run = _cli(["pack-tokens", str(root), "--tokenizer", str(bpe_tokenizer), "--workers", "1", "-q",
                "-o", str(tmp_path / "out")])
    worker = ("import multiprocessing, json as _json\n"
              "from shardsmith.text import tokenize as tk\n"
              f"spec = tk.TokenizerSpec(json=open({str(bpe_tokenizer)!r}).read(), engine='gigatoken', eos_id=0,"
              " bos_id=None, vocab_size=400)\n"
              "def encode(texts):\n"
              "    import sys\n"
              "    tk.Encoder(spec).encode(texts)\n"
              "    return 'awkward' in sys.modules\n"
              "with multiprocessing.get_context('fork').Pool(1) as pool:\n"
              f"    assert pool.apply(encode, ({docs[:5]!r},)) is False\n")
    assert "awkward" not in _imported(run + worker)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["tokenizer"]["engine"] == "gigatoken"


def test_later_stages_of_a_token_run_do_not_load_the_tokenizer(corpus, bpe_tokenizer, tmp_path: Path) -> None:
    """The first process saves what the run takes from the tokenizer (``commands.token_facts``) and
    its engine decision; the other scatter ranks, gather and finalize take them from there instead
    of importing tokenizers and parsing the file, and the dataset is the same bytes."""
    root, _ = corpus
    args = ["pack-tokens", str(root), "--tokenizer", str(bpe_tokenizer), "--shard-tokens", "2000", "--workers", "1",
            "--nanogpt", "-q"]
    one, staged = tmp_path / "one", tmp_path / "staged"
    subprocess.run([sys.executable, "-m", "shardsmith", *args, "-o", str(one)], check=True, timeout=120)
    stage = [*args, "-o", str(staged), "--world-size", "2"]
    assert "tokenizers" in _imported(_cli([*stage, "--stage", "scatter", "--rank", "0"]))  # checks the engine
    assert "tokenizers" not in _imported(_cli([*stage, "--stage", "scatter", "--rank", "1"]))
    assert "tokenizers" not in _imported(_cli([*stage, "--stage", "plan", "--rank", "0"]))
    for rank in (0, 1):
        assert "tokenizers" not in _imported(_cli([*stage, "--stage", "gather", "--rank", str(rank)]))
    assert "tokenizers" not in _imported(_cli([*stage, "--stage", "finalize", "--rank", "0"]))
    same_dataset(one, staged)
