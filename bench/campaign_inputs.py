"""Crafted chat templates and endless side inputs (issue 42, items 7 and 8), and what the user sees.
Not a benchmark of speed: a count of outcomes, one run of each case.

    python bench/campaign_inputs.py [--guard 300] [--memory 4GB] [--workdir /tmp/shardsmith-inputs]
                                    [--pythonpath CHECKOUT]

Each case runs ``python -m shardsmith ...`` on a small input made here, held to ``--memory`` of
address space (an endless read ends there, in a MemoryError, instead of taking the machine) and
to ``--guard`` seconds of wall clock, and sorts the outcome:

- ``one line``: a non-zero exit and stderr exactly one ``shardsmith: error:`` line;
- ``usage``: click's own refusal of an option (exit 2: its usage lines, then one ``Error:`` line);
- ``traceback``, ``hang`` (the guard ended it), ``crash`` (ended by a signal: SIGKILL of the
  memory guard, SIGSEGV), ``silent success`` (exit 0: the attack went through), ``other``;
- ``ignored, as transformers does``: exit 0 where a folder stands in the place of an optional file
  beside the tokenizer (config.json, chat_template.jinja), which transformers skips as absent too.

The cases: crafted templates given as ``--chat-template`` (values of gigabytes, loops and recursion
without end, nesting too deep to compile, output floods, a conversation nested too deep), and the
side files the command line reads whole (``--tokenizer``, ``--decontaminate``, ``--chat-template``,
the files beside the tokenizer, a recipe, ``trace --state``) as a FIFO without a writer,
``/dev/zero``, ``/dev/urandom``, a folder, a 3 GB sparse file and a link to ``/dev/zero``.
``--pythonpath`` runs another checkout's shardsmith (to count the same cases before a change).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TEMPLATES = {
    "repeat 10**9": "{{ 'x' * 10**9 }}",
    "repeat of a repeat": "{{ ('x' * 1000000) * 1000 }}",
    "2,000 nested ifs": "{% if true %}" * 2000 + "{% endif %}" * 2000,
    "3,000 nested parentheses": "{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}",
    "25 nested loops": "{% for a in [1] %}" * 25 + "x" + "{% endfor %}" * 25,
    "nested range(100000) loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "exponential macro": "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "endless recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "doubling with ~": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling with +": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "kept copies": "{% set big = 'x' * 30000000 %}{% set ns = namespace(l=[]) %}{% for i in range(1000) %}"
                   "{% set ns.l = ns.l + [big.upper()] %}{% endfor %}",
    "%-format width": "{{ '%999999999s' % 'x' }}",
    "%-format star": "{{ '%*s' % (999999999, 'x') }}",
    "center": "{{ 'x'|center(999999999) }}",
    "str.ljust": "{{ 'x'.ljust(999999999) }}",
    "str.format width": "{{ '{:>999999999}'.format('x') }}",
    "str.format nested width": "{{ '{:>{w}}'.format('x', w=999999999) }}",
    "int.to_bytes": "{{ (1).to_bytes(999999999, 'big') }}",
    "lipsum": "{{ lipsum(10**6) }}",
    "power": "{{ 7 ** 999999999 }}",
    "join": "{{ (['y' * 1000000] * 1000)|join }}",
    "replace": "{{ ('x' * 1000000)|replace('x', 'y' * 1000) }}",
    "indent": "{{ ('x\\n' * 1000000)|indent(1000) }}",
    "batch": "{{ [1]|batch(999999999, 0)|list|length }}",
    "slice": "{{ [1]|slice(999999999)|list|length }}",
    "sum of lists": "{{ ([[1] * 1000] * 100000)|sum(start=[])|length }}",
    "tojson indent": "{{ messages|tojson(indent=999999999) }}",
    "expandtabs": "{{ ('\\t' * 100000).expandtabs(100000) }}",
    "output flood": "{% for x in range(100000) %}{{ 'a' * 100000 }}{% endfor %}",
    "raw text flood": "{% for x in range(100000) %}" + "b" * 10000 + "{% endfor %}",
    "buffered flood": "{% macro f() %}{% for i in range(100000) %}" + "c" * 10000 + "{% endfor %}{% endmacro %}"
                      "{% set x = f() %}",
    "list repeat": "{{ ((range(100000)|list) * 100000)|length }}",
    # work a step does on what it reads, and memory made where no operator is (review of the budget)
    "text scanned each step": "{% set s = 'x' * 30000000 %}{% for i in range(100000) %}{% for j in range(5) %}"
                              "{% if 'y' in s %}{% endif %}{% endfor %}{% endfor %}",
    "str.count each step": "{% set s = 'x' * 30000000 %}{% for i in range(100000) %}{{ s.count('y') }}{% endfor %}",
    "shared list printed": "{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}"
                           "{% endfor %}{{ ns.x }}",
    "shared tuple hashed": "{% set ns = namespace(x=(1,)) %}{% for i in range(60) %}{% set ns.x = (ns.x, ns.x) %}"
                           "{% endfor %}{{ {ns.x: 1}|length }}",
    "shared macro arguments": "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1, varargs, varargs) }}{% else %}"
                              "{{ varargs|string|length }}{% endif %}{% endmacro %}{{ f(60, 1) }}",
    "groupby each step": "{% for i in range(100000) %}{{ range(100000)|groupby('real')|length }}{% endfor %}",
    "list written out": "{% set s = 'x' * 30000000 %}{{ [s] * 100 }}",
    "constant written out": "{% for i in range(100000) %}{{ '" + "d" * 1000000 + "' }}{% endfor %}",
    "slices kept": "{% set s = 'x' * 30000000 %}{% set ns = namespace(l=[]) %}{% for i in range(1000) %}"
                   "{% set ns.l = ns.l + [s[i:]] %}{% endfor %}",
    "constants filtered at compile": "{% set a = 'x'|center(30000000) %}" * 100,
    "one value formatted 10,000 times": "{{ ('{0}' * 10000).format('x' * 30000000) }}",
}
DEVICES = ("fifo", "/dev/zero", "/dev/urandom", "folder", "sparse 3 GB", "link to /dev/zero")
IGNORED = {"config.json folder", "chat_template.jinja folder"}  # transformers skips a folder there as absent


def _tokenizer_folder(work: Path) -> Path:
    """A ChatML tokenizer folder: a byte-level BPE trained here, its tokenizer_config.json with the template."""
    corpus = work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    words = ["alpha", "beta", "gamma", "<|im_start|>", "<|im_end|>", "user", "assistant"]
    with open(corpus / "a.jsonl", "w") as fh:
        for i in range(300):
            fh.write(json.dumps({"text": " ".join(words[(i * j) % len(words)] for j in range(20))}) + "\n")
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([line for line in (corpus / "a.jsonl").read_text().splitlines()],
                            trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                                special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    folder = work / "chatml"
    folder.mkdir(exist_ok=True)
    (folder / "tokenizer.json").write_text(tok.to_str())
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                              "eos_token": "<|im_end|>", "chat_template": CHATML}))
    return folder


def make_cases(work: Path) -> dict[str, list[str]]:
    """Every case's command line (without ``python -m shardsmith``); ``IGNORED``: those that may succeed."""
    folder = _tokenizer_folder(work)
    chat_in = work / "chat"
    chat_in.mkdir(exist_ok=True)
    hi = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    (chat_in / "c.jsonl").write_text(json.dumps({"messages": hi}) + "\n")
    deep = work / "deep"
    deep.mkdir(exist_ok=True)
    nested: object = "x"
    for _ in range(900):
        nested = [nested]
    (deep / "c.jsonl").write_text(json.dumps({"messages": hi, "tools": [{"type": "function", "deep": nested}]}) + "\n")
    tok = str(folder / "tokenizer.json")
    chat = ["pack-tokens", str(chat_in), "--chat", "--tokenizer", tok]
    cases: dict[str, list[str]] = {}
    for name, source in TEMPLATES.items():
        path = work / "templates" / f"{len(cases)}.jinja"
        path.parent.mkdir(exist_ok=True)
        path.write_text(source)
        cases[f"template: {name}"] = [*chat, "--chat-template", str(path)]
    cases["conversation: tools nested 900 deep"] = ["pack-tokens", str(deep), "--chat", "--tokenizer", tok]
    dataset = work / "dataset"
    subprocess.run([sys.executable, "-m", "shardsmith", "pack-tokens", str(work / "corpus"), "-o", str(dataset),
                    "--tokenizer", tok, "-q"], check=True, env=_env(None))
    for device in DEVICES:
        odd = _odd(work / "odd", device)
        beside = work / f"beside-{len(cases)}"
        cases[f"--tokenizer {device}"] = ["pack-tokens", str(work / "corpus"), "--tokenizer", odd]
        cases[f"--decontaminate {device}"] = ["pack-tokens", str(work / "corpus"), "--tokenizer", tok,
                                              "--decontaminate", odd]
        cases[f"--chat-template {device}"] = [*chat, "--chat-template", odd]
        for name in ("tokenizer_config.json", "config.json", "chat_template.jinja"):
            at = beside / name.split(".")[0]
            shutil.copytree(folder, at)
            (at / name).unlink(missing_ok=True)
            _place(odd, at / name)
            cases[f"{name} {device}"] = ["pack-tokens", str(chat_in), "--chat", "--tokenizer", str(at / "tokenizer.json")]
        cases[f"recipe {device}"] = ["run", odd]
        cases[f"trace --state {device}"] = ["trace", str(dataset), "--state", odd]
    return cases


def _odd(root: Path, device: str) -> str:
    """A path that is the named odd thing (made once)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / device.replace("/", "_").replace(" ", "_")
    if device == "fifo" and not path.exists():
        os.mkfifo(path)
    elif device == "folder":
        path.mkdir(exist_ok=True)
    elif device == "sparse 3 GB" and not path.exists():
        with open(path, "wb") as fh:
            fh.truncate(3 * 10**9)
    elif device.startswith("link to"):
        if not path.is_symlink():
            path.symlink_to("/dev/zero")
    elif device.startswith("/dev/"):
        return device
    return str(path)


def _place(odd: str, at: Path) -> None:
    """``at`` made the odd thing: a FIFO or folder of its own, else a link to it."""
    if Path(odd).is_fifo():
        os.mkfifo(at)
    elif Path(odd).is_dir():
        at.mkdir()
    else:
        at.symlink_to(odd)


def _env(pythonpath: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath or str(HERE.parent)
    return env


def classify(code: int | None, err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    if code is None:
        return "hang"
    if "Traceback" in err:
        return "traceback"
    if code == 0:
        return "silent success"
    if code < 0:
        return "crash"
    if len(lines) == 1 and lines[0].startswith("shardsmith: error:"):
        return "one line"
    if code == 2 and lines and lines[0].startswith("Usage:") and lines[-1].startswith("Error:"):
        return "usage"
    return "other"


def run_case(argv: list[str], *, out: Path, guard: float, memory: int, pythonpath: str | None) -> tuple[str, str, float]:
    shutil.rmtree(out, ignore_errors=True)
    full = [sys.executable, "-m", "shardsmith", *argv]
    if argv[0] == "pack-tokens":
        full += ["-o", str(out), "-q"]

    def held() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    start = time.monotonic()
    # (run in the work folder: python -m puts its folder first on the path, which from a checkout would run
    # that checkout's shardsmith whatever --pythonpath says)
    proc = subprocess.Popen(full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(pythonpath),
                            preexec_fn=held, start_new_session=True, cwd=out.parent)
    try:
        err = proc.communicate(timeout=guard)[1]
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        err, code = proc.communicate()[1], None
    return classify(code, err), err.strip(), time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--guard", type=float, default=300.0, help="seconds of wall clock a case may take")
    ap.add_argument("--memory", default="4GB", help="address space a case may take")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-inputs"))
    ap.add_argument("--pythonpath", default=None, help="the checkout whose shardsmith runs [default: this one]")
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    args = ap.parse_args()
    memory = int(float(args.memory.removesuffix("GB")) * 10**9)
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    cases = make_cases(args.workdir)
    counts: collections.Counter[str] = collections.Counter()
    for name, argv in cases.items():
        if args.only and args.only not in name:
            continue
        kind, err, took = run_case(argv, out=args.workdir / "out", guard=args.guard, memory=memory,
                                   pythonpath=args.pythonpath)
        if kind == "silent success" and name in IGNORED:
            kind = "ignored, as transformers does"
        counts[kind] += 1
        last = err.splitlines()[-1][:150] if err else ""
        print(f"{kind:15s} {took:7.1f}s  {name:45s} {last}", flush=True)
    print("\n" + ", ".join(f"{kind}: {n}" for kind, n in counts.most_common()) + f" (of {sum(counts.values())} cases)")


if __name__ == "__main__":
    main()
