"""A real SLURM run: recipes submitted through recipes/slurm/submit.sh give a local run's shards.

Starts a one-node cluster (tests/slurm/cluster.sh: munge + slurmctld + slurmd, as root), submits
pack-tokens and convert recipes as scatter array jobs of W = 3 and W = 2 tasks with a dependent
gather job, waits, and compares every file but manifest.json byte for byte with a one-process run
of the same recipe. Run with ``make test-slurm`` (not part of ``make test``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "tests/slurm/cluster.sh"
SUBMIT = REPO / "recipes/slurm/submit.sh"
# sbatch options for a 2-core test machine; the templates' defaults (8 cores, 16G) are for real nodes
SBATCH_ARGS = ["--cpus-per-task=1", "--mem=1G", "--time=10"]
WAIT_S = 240
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "über", "café", "東京", "🙂", "data", "shard", "token", "seed"]

RECIPES = {
    "tokens": """command = "pack-tokens"
inputs = ["data/corpus"]
out = "{out}"
[options]
tokenizer = "tokenizer.json"
seq-len = 64
shard-tokens = "3000"
split = {{ train = 0.8, val = 0.2 }}
nanogpt = true
memory = "256KB"
seed = 7
""",
    # babylm-tokens.toml's way: every rank trains the same BPE on all inputs (deterministic)
    "trained": """command = "pack-tokens"
inputs = ["data/corpus"]
out = "{out}"
[options]
train-tokenizer = 300
shard-tokens = "4000"
split = {{ train = 0.9, val = 0.1 }}
seed = 1
""",
    "tar": """command = "convert"
inputs = ["data/corpus"]
out = "{out}"
[options]
to = "webdataset"
text-field = "text"
shard-samples = 150
split = {{ train = 0.9, val = 0.1 }}
memory = "256KB"
seed = 3
""",
}
CASES = [("tokens", 3), ("tokens", 2), ("trained", 3), ("tar", 3), ("tar", 2)]


def _free_port_pair() -> int:
    """A port p with p and p + 1 free (slurmctld, slurmd), so a cluster already here is left alone."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65000:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def _corpus(folder: Path) -> list[str]:
    """Uneven JSONL files (one gzipped), so ranks get unequal shares."""
    rng = random.Random(0)
    texts = []
    folder.mkdir(parents=True)
    for f, n in enumerate([400, 37, 250, 1, 180]):
        lines = []
        for i in range(n):
            text = f"doc {f}/{i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 40)))
            texts.append(text)
            lines.append(json.dumps({"id": f"{f}-{i}", "text": text}, ensure_ascii=False) + "\n")
        body = "".join(lines).encode()
        if f == 2:
            (folder / f"part-{f}.jsonl.gz").write_bytes(gzip.compress(body, mtime=0))
        else:
            (folder / f"part-{f}.jsonl").write_bytes(body)
    return texts


def _digests(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file() and p.name != "manifest.json"}


def _job_states(job: str, env: dict[str, str]) -> dict[str, str]:
    """{"ID" or "ID_TASK": state} from scontrol (finished jobs stay there ~5 min; sacct needs a database)."""
    res = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True)
    states = {}
    for line in res.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        key = fields.get("JobId", "?")
        if fields.get("ArrayTaskId"):
            key = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}"
        states[key] = f"{fields.get('JobState')} ({fields.get('Reason')}, exit {fields.get('ExitCode')})"
    return states


def _logs(work: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                     for p in sorted((work / "slurm-logs").glob("*")))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A running one-node cluster: the environment to submit with. Stopped (and checked) at the end."""
    if os.geteuid() != 0:
        pytest.skip("a real SLURM cluster needs root (the daemons run as root here)")
    folder = tmp_path_factory.mktemp("slurm")
    env = dict(os.environ, SHARDSMITH_SLURM_PORT=str(_free_port_pair()))
    try:
        res = subprocess.run(["bash", str(CLUSTER), "start", str(folder)], env=env, capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, f"cluster.sh start failed:\n{res.stderr}"
        assert res.stdout.strip() == f"export SLURM_CONF={folder}/slurm.conf", res.stdout
        env["SLURM_CONF"] = str(folder / "slurm.conf")
        env["PYTHON"] = sys.executable
        yield env
    finally:
        res = subprocess.run(["bash", str(CLUSTER), "stop", str(folder)], env=env, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        for pidfile in ("slurmctld.pid", "slurmd.pid", "munge/munged.pid"):
            assert not (folder / pidfile).exists(), f"{pidfile} left after cluster.sh stop"
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            assert str(folder) not in cmdline, f"daemon left after stop: {cmdline}"


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """Every case submitted at once (the scheduler overlaps them), the local runs meanwhile, then waited for."""
    from shardsmith.transforms.tokenize import train_bpe

    work = tmp_path_factory.mktemp("work")
    texts = _corpus(work / "data/corpus")
    (work / "tokenizer.json").write_text(train_bpe(texts, vocab_size=400), encoding="utf-8")
    jobs: dict[object, tuple[str, str]] = {}
    hints = {}
    for kind, world in CASES:
        recipe = work / f"{kind}-w{world}.toml"
        recipe.write_text(RECIPES[kind].format(out=f"out/{kind}-w{world}"))
        jobs[(kind, world)], _ = _submit(recipe, world, cluster, cwd=work)
    # a chain whose scatter fails (an input that is not there): gather must never run
    (work / "broken.toml").write_text(RECIPES["tar"].format(out="out/broken").replace('"data/corpus"', '"data/missing"'))
    jobs["broken"], _ = _submit(work / "broken.toml", 2, cluster, cwd=work)
    # a chain whose rank 1 dies (as on a lost node) until the file "healed" exists: rerun alone later
    flaky = work / "flaky-python"
    flaky.write_text(f'#!/bin/sh\nif [ "$SLURM_ARRAY_TASK_ID" = 1 ] && [ ! -e healed ]; then\n'
                     f'    echo "simulated node failure" >&2; exit 3\nfi\nexec {sys.executable} "$@"\n')
    flaky.chmod(0o755)
    (work / "flaky.toml").write_text(RECIPES["tokens"].format(out="out/flaky"))
    jobs["flaky"], hints["flaky"] = _submit(work / "flaky.toml", 3, dict(cluster, PYTHON=str(flaky)), cwd=work)

    started = time.monotonic()
    local = {}
    for kind in RECIPES:
        (work / f"{kind}-local.toml").write_text(RECIPES[kind].format(out=f"out/{kind}-local"))
        res = subprocess.run([sys.executable, "-m", "shardsmith", "run", f"{kind}-local.toml", "--set", "quiet=true"],
                             cwd=work, capture_output=True, text=True, timeout=WAIT_S)
        assert res.returncode == 0, res.stderr
        local[kind] = work / f"out/{kind}-local"
    _wait(cluster, work, started)
    states = {case: {**_job_states(s, cluster), **_job_states(g, cluster)} for case, (s, g) in jobs.items()}
    return work, jobs, states, local, hints


def _submit(recipe: Path, tasks: int, env: dict[str, str], *, cwd: Path) -> tuple[tuple[str, str], str]:
    """(scatter id, gather id), and the hints submit.sh printed."""
    res = subprocess.run(["bash", str(SUBMIT), recipe.name, str(tasks), *SBATCH_ARGS], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"submit.sh failed:\n{res.stderr}"
    ids = dict(item.split("=") for item in res.stdout.split())
    return (ids["scatter"], ids["gather"]), res.stderr


def _wait(env: dict[str, str], work: Path, started: float) -> None:
    """Until the queue is empty (this cluster runs only this test's jobs), at most WAIT_S."""
    while True:
        res = subprocess.run(["squeue", "-h", "-o", "%i %T %r"], env=env, capture_output=True, text=True)
        assert res.returncode == 0, f"squeue failed (controller down?): {res.stderr}"
        if not res.stdout.strip():
            return
        if time.monotonic() - started > WAIT_S:
            pytest.fail(f"jobs still queued after {WAIT_S} s:\n{res.stdout}\n{_logs(work)}")
        time.sleep(0.25)


@pytest.mark.parametrize("kind, world", CASES, ids=[f"{k}-w{w}" for k, w in CASES])
def test_slurm_array_gives_the_local_runs_shards(runs, kind, world):
    work, jobs, states, local, _ = runs
    scatter, gather = jobs[(kind, world)]
    state = states[(kind, world)]
    expected = {**{f"{scatter}_{r}": "COMPLETED" for r in range(world)}, gather: "COMPLETED"}
    got = {k: v.split()[0] for k, v in state.items()}
    assert got == expected, f"{state}\n{_logs(work)}"
    for rank in range(world):  # one log per array task, saying which rank it was
        log = work / "slurm-logs" / f"shardsmith-scatter-{scatter}_{rank}.out"
        assert f"rank {rank} of {world}" in log.read_text(), _logs(work)
    assert (work / "slurm-logs" / f"shardsmith-gather-{gather}.out").is_file()

    out = work / f"out/{kind}-w{world}"
    assert (out / "manifest.json").is_file()
    mine, theirs = _digests(out), _digests(local[kind])
    assert len(theirs) > 4, theirs  # several shards per split, else the comparison proves little
    assert mine == theirs
    assert not (out.parent / f".{out.name}.shardsmith-work").exists(), "gather left the scratch folder"


def test_a_failed_scatter_rank_keeps_gather_from_running(runs):
    work, jobs, states, _, _ = runs
    scatter, gather = jobs["broken"]
    state = states["broken"]
    assert all(state[f"{scatter}_{r}"].startswith("FAILED") for r in range(2)), state
    assert state[gather].startswith("CANCELLED") and "Dependency" in state[gather], state
    assert not (work / "out/broken/manifest.json").exists()
    assert not (work / "slurm-logs" / f"shardsmith-gather-{gather}.out").exists()


def test_a_failed_rank_rerun_alone_then_gather_gives_the_same_shards(runs, cluster):
    """What submit.sh's hint says to do: resubmit rank 1 alone (--array=1), then the gather."""
    work, jobs, states, local, hints = runs
    scatter, gather = jobs["flaky"]
    state = {k: v.split()[0] for k, v in states["flaky"].items()}
    assert state == {f"{scatter}_0": "COMPLETED", f"{scatter}_1": "FAILED", f"{scatter}_2": "COMPLETED",
                     gather: "CANCELLED"}, states["flaky"]
    assert "simulated node failure" in (work / "slurm-logs" / f"shardsmith-scatter-{scatter}_1.out").read_text()
    recipe = work / "flaky.toml"
    again = f"RECIPE={recipe} SHARDSMITH_WORLD_SIZE=3 sbatch --export=ALL {' '.join(SBATCH_ARGS)}"
    assert f"{again} --array=R {SUBMIT.parent}/scatter.sbatch" in hints["flaky"], hints["flaky"]
    assert f"{again} --dependency=afterok:<that job id> {SUBMIT.parent}/gather.sbatch" in hints["flaky"]

    (work / "healed").touch()
    lines = {line.split()[-1]: line.strip() for line in hints["flaky"].splitlines() if "sbatch --export" in line}

    def run_hint(template: str, **subs: str) -> str:  # the hint's command line, as a user pastes it
        line = lines[str(SUBMIT.parent / template)]
        for old, new in subs.items():
            line = line.replace(old, new)
        res = subprocess.run(["bash", "-c", line], cwd=work, env=cluster, capture_output=True, text=True)
        assert res.returncode == 0, f"{line}\n{res.stderr}"
        return res.stdout.split()[-1]  # "Submitted batch job ID"

    rerun = run_hint("scatter.sbatch", **{"--array=R": "--array=1"})
    gather = run_hint("gather.sbatch", **{"<that job id>": rerun})
    _wait(cluster, work, time.monotonic())
    state = {**_job_states(rerun, cluster), **_job_states(gather, cluster)}
    assert {k: v.split()[0] for k, v in state.items()} == {f"{rerun}_1": "COMPLETED", gather: "COMPLETED"}, \
        f"{state}\n{_logs(work)}"
    # rank 1 of 3, although SLURM_ARRAY_TASK_COUNT is 1 in a one-task array
    assert "rank 1 of 3" in (work / "slurm-logs" / f"shardsmith-scatter-{rerun}_1.out").read_text()
    assert _digests(work / "out/flaky") == _digests(local["tokens"])


def test_submit_without_sbatch_says_so(tmp_path):
    bin_dir = tmp_path / "bin"  # a PATH with bash but no sbatch
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "env"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    res = subprocess.run([str(bin_dir / "bash"), str(SUBMIT), "recipes/babylm-tokens.toml", "2"], cwd=REPO,
                         env={"PATH": str(bin_dir)}, capture_output=True, text=True)
    assert res.returncode == 127
    assert "sbatch not found" in res.stderr and res.stdout == ""


def test_submit_checks_its_arguments(tmp_path):
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    (tmp_path / "sbatch").write_text("#!/bin/sh\necho should-not-run >&2; exit 99\n")
    (tmp_path / "sbatch").chmod(0o755)
    for args, message in [([], "usage:"), (["recipes/nope.toml", "2"], "no such recipe"),
                          (["recipes/babylm-tokens.toml", "0"], "TASKS must be"),
                          (["recipes/babylm-tokens.toml", "x"], "TASKS must be")]:
        res = subprocess.run(["bash", str(SUBMIT), *args], cwd=REPO, env=env, capture_output=True, text=True)
        assert res.returncode == 2 and message in res.stderr, (args, res.stderr)
        assert "should-not-run" not in res.stderr
