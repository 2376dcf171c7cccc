"""Where users' runs really are: two runs into one folder, Ctrl-C and preemption, inputs that change
while they are read or between a kill and its rerun, a run that failed on a mistake, and a run
killed just after its manifest. Every test runs the real program in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Stall, run_subprocess, tree_digest, two_file_corpus

MESSAGE = "shardsmith: interrupted: run the same command again to resume"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return two_file_corpus(tmp_path_factory.mktemp("world-corpus"), 3000, seed=5, max_words=50, first=1600)


def _pack(corpus: Path, out: Path, tokenizer: Path, *extra: str) -> list[str]:
    return ["pack-tokens", str(corpus), "-o", str(out), "--tokenizer", str(tokenizer), "--memory", "512KB",
            "--workers", "1", "-q", *extra]


def _start(args: list[str], tmp_path: Path, stall: str, **env: str) -> tuple[subprocess.Popen[str], Stall]:
    """The program, started in the background and held at a stall point until the test releases it
    (never released: held for ten minutes, so a run that ends sooner ended by what the test did)."""
    held = Stall(tmp_path, stall)
    proc = subprocess.Popen([sys.executable, "-m", "shardsmith", *args], env={**os.environ, **env, **held.env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    held.reached(proc)
    return proc, held


def _reference(corpus: Path, tokenizer: Path, tmp_path: Path) -> str:
    ref = tmp_path / "reference"
    assert run_subprocess(*_pack(corpus, ref, tokenizer)).returncode == 0
    return tree_digest(ref)


# -- 1. one writer per output folder ------------------------------------------------------------------

@pytest.mark.parametrize("method", ["record-lock", "file"])
def test_a_second_run_into_the_same_folder_is_refused_at_once(corpus, bpe_tokenizer, tmp_path, method):
    env = {"SHARDSMITH_LOCK": "file"} if method == "file" else {}
    out = tmp_path / "out"
    first, held = _start(_pack(corpus, out, bpe_tokenizer), tmp_path, "scatter:0", **env)
    # refused while the first run is held: had it waited for the lock, it would wait past any timeout
    second = run_subprocess(*_pack(corpus, out, bpe_tokenizer, "--seed", "7"), env={**os.environ, **env})
    held.release()
    assert second.returncode == 1, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "another run is writing into it" in lines[0], second.stderr
    assert f"pid {first.pid} " in lines[0] and "started 20" in lines[0], lines[0]
    assert first.wait(300) == 0, first.stderr.read()
    assert tree_digest(out) == _reference(corpus, bpe_tokenizer, tmp_path)
    assert not list(tmp_path.glob(".out.shardsmith-lock*")), "the lock is gone with its run"


@pytest.mark.parametrize("method", ["record-lock", "file"])
def test_a_lock_left_by_a_dead_run_is_taken_over(corpus, bpe_tokenizer, tmp_path, method):
    env = {"SHARDSMITH_LOCK": "file"} if method == "file" else {}
    out = tmp_path / "out"
    first, _ = _start(_pack(corpus, out, bpe_tokenizer), tmp_path, "scatter:1", **env)
    first.kill()
    first.wait()
    assert list(tmp_path.glob(".out.shardsmith-lock*")), "kill -9 leaves the lock file behind"
    rerun = run_subprocess(*_pack(corpus, out, bpe_tokenizer), env={**os.environ, **env})
    assert rerun.returncode == 0, rerun.stderr
    assert tree_digest(out) == _reference(corpus, bpe_tokenizer, tmp_path)


def test_cluster_ranks_share_the_folder_but_no_rank_runs_twice(corpus, bpe_tokenizer, tmp_path):
    out = tmp_path / "out"

    def stage(rank: int, *extra: str) -> list[str]:
        return [*_pack(corpus, out, bpe_tokenizer), "--stage", "scatter", "--rank", str(rank), "--world-size", "2",
                *extra]

    rank0, held = _start(stage(0), tmp_path, "scatter:0")  # holds rank 0 until the checks below are done
    assert run_subprocess(*stage(1)).returncode == 0  # another rank of the same run: shares the folder
    again = run_subprocess(*stage(0))
    assert again.returncode == 1 and "--stage scatter rank 0" in again.stderr, again.stderr
    whole = run_subprocess(*_pack(corpus, out, bpe_tokenizer))
    assert whole.returncode == 1 and "another run is writing into it" in whole.stderr, whole.stderr
    held.release()
    assert rank0.wait(300) == 0, rank0.stderr.read()
    for step in ("plan", "gather", "finalize"):
        assert run_subprocess(*_pack(corpus, out, bpe_tokenizer), "--stage", step, "--rank", "0",
                              "--world-size", "1").returncode == 0
    assert tree_digest(out) == _reference(corpus, bpe_tokenizer, tmp_path)


# -- 5. Ctrl-C and SIGTERM ------------------------------------------------------------------------------

@pytest.mark.parametrize("sig, code, point", [
    (signal.SIGINT, 130, "claimed"),          # before the first task
    (signal.SIGTERM, 143, "scatter:1"),       # between tasks: task 1 is a finished part
    (signal.SIGINT, 130, "gather:train:0"),   # while writing shards
])
def test_interrupted_runs_say_one_line_keep_their_parts_and_resume(corpus, bpe_tokenizer, tmp_path, sig, code,
                                                                   point):
    out = tmp_path / "out"
    proc, _ = _start(_pack(corpus, out, bpe_tokenizer, "--workers", "2"), tmp_path, point)  # never released
    parts_before = sorted(p.name for p in (tmp_path / ".out.shardsmith-work").glob("part-*.bin"))
    proc.send_signal(sig)
    assert proc.wait(300) == code  # held for ten minutes otherwise: it ended because of the signal
    assert proc.stderr.read().strip().splitlines() == [MESSAGE]
    parts_after = sorted(p.name for p in (tmp_path / ".out.shardsmith-work").glob("part-*.bin"))
    assert set(parts_before) <= set(parts_after), "finished parts are kept"
    if point == "scatter:1":  # task 1's part is written before its stall; task 0 ran in the other worker,
        assert "part-000001.bin" in parts_after  # which may not have finished it when the signal came
    rerun = run_subprocess(*_pack(corpus, out, bpe_tokenizer, "--workers", "2"))
    assert rerun.returncode == 0, rerun.stderr
    assert tree_digest(out) == _reference(corpus, bpe_tokenizer, tmp_path)


@pytest.mark.parametrize("delay", [None, 0.0, 0.15, 0.4])
def test_ctrl_c_at_start_up_and_to_the_whole_process_group(corpus, bpe_tokenizer, tmp_path, delay):
    """Held where the program's first line has taken the signals (before that, a millisecond of the
    interpreter's own start-up keeps Python's defaults: bench/README.md's early-signal campaign),
    then Ctrl-C while held (``None``) or once let go, wherever start-up is by ``delay`` seconds."""
    held = Stall(tmp_path, "start-up")
    proc = subprocess.Popen([sys.executable, "-m", "shardsmith", *_pack(corpus, tmp_path / "o", bpe_tokenizer,
                                                                       "--workers", "2")],
                            env={**os.environ, **held.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    held.reached(proc)
    if delay is None:
        os.killpg(proc.pid, signal.SIGINT)
        held.release()
    else:
        held.release()
        time.sleep(delay)  # wherever start-up is by then (on a loaded machine, anywhere): the same outcome
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the program and all its workers
    code = proc.wait(300)
    err = proc.stderr.read()
    if code == 0 and delay:  # finished before the signal: nothing to check
        return
    assert code == 130 and err.strip().splitlines() == [MESSAGE], (delay, code, err)
    assert "Traceback" not in err


def test_a_main_thread_busy_in_native_code_still_ends_within_two_seconds(tmp_path):
    """A long call into C or Rust (a tokenizer) runs no Python signal handler until it returns: the
    signal thread ends the process itself."""
    script = (
        "import hashlib\n"
        "from shardsmith.engine.processes import interrupt\n"
        "interrupt.install()\n"
        "print('ready', flush=True)\n"
        "hashlib.pbkdf2_hmac('sha256', b'x', b'salt', 2_000_000_000)  # one C call of ten minutes or more\n"
        "print('finished', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # into the C call (a signal still in Python code is the ordinary case, tested above)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(300) == 143  # the C call alone lasts ten minutes: the signal thread ended it
    assert proc.stdout.read() == ""
    assert proc.stderr.read().strip().splitlines() == [MESSAGE]


# -- 3. an input that changes while it is read; 4. between a kill and the rerun ------------------------

def test_an_input_truncated_while_it_is_read_ends_the_run(corpus, bpe_tokenizer, tmp_path):
    src = shutil.copytree(corpus, tmp_path / "in")  # a copy of the input to change
    out = tmp_path / "out"
    proc, held = _start(_pack(src, out, bpe_tokenizer), tmp_path, "claimed")  # inputs listed, none read yet
    data = (src / "b.jsonl").read_bytes()
    cut = data.index(b"\n", len(data) // 2) + 1  # at a line boundary: every line left is valid
    (src / "b.jsonl").write_bytes(data[:cut])
    held.release()
    assert proc.wait(300) == 1
    err = proc.stderr.read().strip().splitlines()
    assert len(err) == 1 and "b.jsonl" in err[0] and "changed while it was read" in err[0], err
    assert "--on-error skip" not in err[0]  # not a bad record: skipping would not help
    assert not (out / "manifest.json").exists()


def test_a_rerun_never_reuses_parts_of_an_input_edited_in_place(corpus, bpe_tokenizer, tmp_path):
    src = shutil.copytree(corpus, tmp_path / "in")  # a copy of the input to change
    out = tmp_path / "out"
    env = {**os.environ, "SHARDSMITH_CRASH_AT": "scatter:1"}
    assert run_subprocess(*_pack(src, out, bpe_tokenizer), env=env).returncode == -signal.SIGKILL
    target = src / "a.jsonl"
    st = target.stat()
    data = target.read_bytes()
    edited = data.replace(b"alpha", b"ALPHA")  # same size, other tokens
    assert len(edited) == len(data) and edited != data
    target.write_bytes(edited)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime set back: only the ctime tells
    assert run_subprocess(*_pack(src, out, bpe_tokenizer)).returncode == 0
    fresh = tmp_path / "fresh"
    assert run_subprocess(*_pack(src, fresh, bpe_tokenizer)).returncode == 0
    assert tree_digest(out) == tree_digest(fresh)


# -- 6. a run that failed on a mistake; 7. killed after its manifest -----------------------------------

def test_a_failed_run_never_refuses_the_corrected_command(corpus, bpe_tokenizer, tmp_path):
    out = tmp_path / "new" / "out"
    wrong = run_subprocess("pack-tokens", corpus, "-o", out, "--train-tokenizer", "300", "--text-field", "body", "-q")
    assert wrong.returncode == 1 and "'body'" in wrong.stderr, wrong.stderr
    assert not (tmp_path / "new").exists(), "a failed run leaves no empty folder behind"
    (tmp_path / "not-json.json").write_text("not json")
    bad = run_subprocess("pack-tokens", corpus, "-o", out, "--tokenizer", tmp_path / "not-json.json", "-q")
    assert bad.returncode == 2 and not out.exists(), bad.stderr
    # in a folder that was there before, the failed run's leftovers do not block the fixed command
    out.mkdir(parents=True)
    assert run_subprocess("pack-tokens", corpus, "-o", out, "--train-tokenizer", "300", "--text-field", "body",
                          "-q").returncode == 1
    ok = run_subprocess("pack-tokens", corpus, "-o", out, "--train-tokenizer", "300", "-q")
    assert ok.returncode == 0, ok.stderr
    assert (out / "manifest.json").exists()


def test_a_run_killed_after_its_manifest_is_complete(corpus, bpe_tokenizer, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "SHARDSMITH_CRASH_AT": "committed"}
    assert run_subprocess(*_pack(corpus, out, bpe_tokenizer), env=env).returncode == -signal.SIGKILL
    assert (out / "manifest.json").exists() and (out / ".shardsmith-run.json").exists()
    assert (tmp_path / ".out.shardsmith-work").exists()
    manifest = (out / "manifest.json").read_bytes()
    again = run_subprocess(*_pack(corpus, out, bpe_tokenizer)[:-1])  # without -q: the summary
    assert again.returncode == 0, again.stderr
    assert "already complete" in again.stderr
    assert (out / "manifest.json").read_bytes() == manifest
    assert not (out / ".shardsmith-run.json").exists() and not (tmp_path / ".out.shardsmith-work").exists()
    assert json.loads(manifest)["splits"]["train"]["samples"] == 3000


@pytest.mark.parametrize("point", ["cleaned", None])
def test_the_same_command_after_a_finished_run_is_already_complete(corpus, bpe_tokenizer, tmp_path, point):
    """Killed after its cleanup (nothing left but the dataset), or simply run again: the manifest
    records the run's identity, so the same command says "already complete" and exits 0; another
    command (other options) still needs --overwrite, and --overwrite makes it again."""
    out = tmp_path / "out"
    env = {**os.environ, "SHARDSMITH_CRASH_AT": point} if point else None
    first = run_subprocess(*_pack(corpus, out, bpe_tokenizer), env=env)
    assert first.returncode == (-signal.SIGKILL if point else 0), first.stderr
    assert not (out / ".shardsmith-run.json").exists() and not (tmp_path / ".out.shardsmith-work").exists()
    manifest = (out / "manifest.json").read_bytes()
    again = run_subprocess(*_pack(corpus, out, bpe_tokenizer)[:-1])
    assert again.returncode == 0, again.stderr
    assert f"{out}: already complete (this same command finished it; nothing to do)" in again.stderr
    assert (out / "manifest.json").read_bytes() == manifest
    other = run_subprocess(*_pack(corpus, out, bpe_tokenizer, "--seed", "9"))
    assert other.returncode == 2 and "pass --overwrite" in other.stderr
    remade = run_subprocess(*_pack(corpus, out, bpe_tokenizer, "--overwrite")[:-1])
    assert remade.returncode == 0 and "already complete" not in remade.stderr, remade.stderr
    assert "3,000 documents" in remade.stdout + remade.stderr  # made again: its summary


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_click_parses_the_options_is_one_line(corpus, bpe_tokenizer, tmp_path, sig, code):
    """Click turns a KeyboardInterrupt raised while it parses into "Aborted!" and exit 1: start-up
    holds the signal until the command's body begins, which says the one line."""
    proc, held = _start(_pack(corpus, tmp_path / "out", bpe_tokenizer), tmp_path, "start-up")
    proc.send_signal(sig)  # held while start-up holds the signal ...
    held.release()  # ... which the command's body then says
    assert proc.wait(300) == code
    err = proc.stderr.read()
    assert err.strip().splitlines() == [MESSAGE], err
    assert not (tmp_path / "out").exists()  # the command stopped as it began


EXTENSION_SCRIPT = """
import os, signal, sys
from shardsmith.engine.processes import interrupt
if sys.argv[1] == "program":
    interrupt.install(); getattr(interrupt, "started", lambda: None)()  # (start-up over)

class Trip:
    # SIGINT to this process while orjson's extension initializes (its init imports json.encoder)
    def find_spec(self, name, path=None, target=None):
        if name == "json.encoder":
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, Trip())
try:
    import orjson
except KeyboardInterrupt:
    print("interrupted after the import")
print(__import__("orjson").dumps([1]).decode())
"""


def test_a_signal_while_an_extension_initializes_is_raised_after_it(tmp_path):
    """Raised inside an extension's init (in a module the init imports), a KeyboardInterrupt leaves
    orjson half made and the process dies of SIGSEGV; the program holds it until the init is done."""
    script = tmp_path / "ext.py"
    script.write_text(EXTENSION_SCRIPT)
    done = subprocess.run([sys.executable, str(script), "program"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["interrupted", "after", "the", "import", "[1]"], done
