"""A real SLURM run: recipes submitted through recipes/slurm/submit.sh give a local run's shards.

Starts a one-node cluster (tests/slurm/cluster.sh: munge + slurmctld + slurmd, as root), submits
pack-tokens and convert recipes as four dependent jobs (scatter and gather array jobs of W = 3 and
W = 2 tasks, then finalize), waits, and compares every file but manifest.json byte for byte with a
one-process run of the same recipe. A failed scatter rank and a killed gather rank are rerun alone,
as submit.sh's hints say. Run with ``make test-slurm`` (not part of ``make test``)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
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
    """sha256 of every file but the manifest (the time) and the dataset card (the command line, which
    names the output and the stage: tests/test_card.py), as conftest.tree_digest."""
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file() and p.name not in ("manifest.json", "README.md")}


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


def _flaky_python(work: Path, name: str, stage: str, action: str) -> Path:
    """An interpreter whose ``stage`` rank 1 fails (``action``, shell) until the file ``healed-NAME``
    exists: a lost node, then the rerun that finds it healthy."""
    path = work / f"{name}-python"
    path.write_text(f'#!/bin/sh\nif [ "$SLURM_JOB_NAME" = shardsmith-{stage} ] && [ "$SLURM_ARRAY_TASK_ID" = 1 ] '
                    f'&& [ ! -e healed-{name} ]; then\n    {action}\nfi\nexec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """Every case submitted at once (the scheduler overlaps them), the local runs meanwhile, then waited for."""
    from shardsmith.text.tokenize import train_bpe

    work = tmp_path_factory.mktemp("work")
    texts = _corpus(work / "data/corpus")
    (work / "tokenizer.json").write_text(train_bpe(texts, vocab_size=400), encoding="utf-8")
    jobs: dict[object, tuple[str, str, str]] = {}
    hints = {}
    for kind, world in CASES:
        recipe = work / f"{kind}-w{world}.toml"
        recipe.write_text(RECIPES[kind].format(out=f"out/{kind}-w{world}"))
        jobs[(kind, world)], _ = _submit(recipe, world, cluster, cwd=work)
    # a chain whose scatter fails on every rank (two inputs, one task each, neither JSON): gather and finalize must
    # never run (an input that is not there is refused by submit.sh's dry run, before anything is submitted)
    for name in ("a", "b"):
        (work / "data/broken").mkdir(parents=True, exist_ok=True)
        (work / "data/broken" / f"{name}.jsonl").write_text("this line is not JSON\n")
    (work / "broken.toml").write_text(RECIPES["tar"].format(out="out/broken").replace('"data/corpus"', '"data/broken"'))
    jobs["broken"], _ = _submit(work / "broken.toml", 2, cluster, cwd=work)
    # a chain whose scatter rank 1 dies (as on a lost node): rerun alone later
    python = _flaky_python(work, "scatter", "scatter", 'echo "simulated node failure" >&2; exit 3')
    (work / "flaky.toml").write_text(RECIPES["tokens"].format(out="out/flaky"))
    jobs["flaky"], hints["flaky"] = _submit(work / "flaky.toml", 3, dict(cluster, PYTHON=str(python)), cwd=work)
    # a chain whose gather rank 1 is SIGKILLed after its first batch of train samples (shards half written)
    python = _flaky_python(work, "gather", "gather",
                           'echo "simulated kill mid-write" >&2; export SHARDSMITH_CRASH_AT=gather:train:0')
    (work / "killed.toml").write_text(RECIPES["tokens"].format(out="out/killed"))
    jobs["killed"], hints["killed"] = _submit(work / "killed.toml", 3, dict(cluster, PYTHON=str(python)), cwd=work)

    started = time.monotonic()
    local = {}
    for kind in RECIPES:
        (work / f"{kind}-local.toml").write_text(RECIPES[kind].format(out=f"out/{kind}-local"))
        res = subprocess.run([sys.executable, "-m", "shardsmith", "run", f"{kind}-local.toml", "--set", "quiet=true"],
                             cwd=work, capture_output=True, text=True, timeout=WAIT_S)
        assert res.returncode == 0, res.stderr
        local[kind] = work / f"out/{kind}-local"
    _wait(cluster, work, started)
    states = {case: {k: v for job in ids for k, v in _job_states(job, cluster).items()} for case, ids in jobs.items()}
    return work, jobs, states, local, hints


def _submit(recipe: Path, tasks: int, env: dict[str, str], *, cwd: Path) -> tuple[tuple[str, str, str, str], str]:
    """(scatter id, plan id, gather id, finalize id), and the hints submit.sh printed."""
    res = subprocess.run(["bash", str(SUBMIT), recipe.name, str(tasks), *SBATCH_ARGS], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"submit.sh failed:\n{res.stderr}"
    ids = dict(item.split("=") for item in res.stdout.split())
    assert list(ids) == ["scatter", "plan", "gather", "finalize"], res.stdout
    return (ids["scatter"], ids["plan"], ids["gather"], ids["finalize"]), res.stderr


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


def _short(states: dict[str, str]) -> dict[str, str]:
    return {k: v.split()[0] for k, v in states.items()}


def _ranges(log: str) -> list[tuple[int, int]]:
    """The train shard ranges a gather rank's log says it wrote (one line, from the command)."""
    line = next((ln for ln in log.splitlines() if ": gather rank " in ln and ": wrote " in ln), None)
    assert line is not None, log
    return [(int(a), int(b)) for a, b in re.findall(r"train shards (\d+)\.\.(\d+)", line)]


@pytest.mark.parametrize("kind, world", CASES, ids=[f"{k}-w{w}" for k, w in CASES])
def test_slurm_array_gives_the_local_runs_shards(runs, kind, world):
    work, jobs, states, local, _ = runs
    scatter, plan, gather, finalize = jobs[(kind, world)]
    expected = {**{f"{scatter}_{r}": "COMPLETED" for r in range(world)}, plan: "COMPLETED",
                **{f"{gather}_{r}": "COMPLETED" for r in range(world)}, finalize: "COMPLETED"}
    assert _short(states[(kind, world)]) == expected, f"{states[(kind, world)]}\n{_logs(work)}"
    logs = work / "slurm-logs"
    for rank in range(world):  # one log per array task, saying which rank it was
        assert f"rank {rank} of {world}" in (logs / f"shardsmith-scatter-{scatter}_{rank}.out").read_text(), _logs(work)
    # the gather ranks wrote contiguous, disjoint ranges of the train shards, all of them between them
    ranges = sorted(r for rank in range(world)
                    for r in _ranges((logs / f"shardsmith-gather-{gather}_{rank}.out").read_text()))
    assert len(ranges) == world, ranges  # every rank had a share: the gather really was spread out
    manifest = json.loads((work / f"out/{kind}-w{world}/manifest.json").read_text())
    train = len(manifest["splits"]["train"]["shards"])
    assert [a for a, _ in ranges] == [0] + [b + 1 for _, b in ranges[:-1]] and ranges[-1][1] == train - 1, ranges
    assert (logs / f"shardsmith-finalize-{finalize}.out").is_file()

    out = work / f"out/{kind}-w{world}"
    mine, theirs = _digests(out), _digests(local[kind])
    assert len(theirs) > 4, theirs  # several shards per split, else the comparison proves little
    assert mine == theirs
    assert not (out.parent / f".{out.name}.shardsmith-work").exists(), "finalize left the scratch folder"


def test_a_failed_scatter_rank_keeps_gather_and_finalize_from_running(runs):
    work, jobs, states, _, _ = runs
    scatter, plan, gather, finalize = jobs["broken"]
    state = states["broken"]
    assert all(state[f"{scatter}_{r}"].startswith("FAILED") for r in range(2)), state
    later = {k: v for k, v in state.items() if not k.startswith(f"{scatter}_")}
    assert later and plan in later and any(k.startswith(f"{gather}_") for k in later) and finalize in later, state
    assert all(v.startswith("CANCELLED") and "Dependency" in v for v in later.values()), state
    assert not (work / "out/broken/manifest.json").exists()
    assert not list((work / "slurm-logs").glob(f"shardsmith-gather-{gather}_*"))
    assert not (work / "slurm-logs" / f"shardsmith-finalize-{finalize}.out").exists()


def _hint(hints: str, title: str, rank: int) -> str:
    """The lines submit.sh printed under ``title`` (as a user pastes them), for rank ``rank``."""
    lines = hints.splitlines()
    block = []
    for line in lines[lines.index(f"   {title}:") + 1:]:
        if not line.startswith("    "):
            break
        block.append(line.strip())
    assert block, hints
    return "\n".join(block).replace("--array=R ", f"--array={rank} ")


def _paste(block: str, env: dict[str, str], work: Path) -> dict[str, str]:
    """Run a hint's lines in bash; the job ids they set ($s, $p, $g) and the last one submitted (f)."""
    res = subprocess.run(["bash", "-c", f'set -e\n{block}\necho "ids=${{s:-}},${{p:-}},${{g:-}}"'], cwd=work,
                         env=env, capture_output=True, text=True)
    assert res.returncode == 0, f"{block}\n{res.stderr}"
    s, p, g = res.stdout.split("ids=")[-1].strip().split(",")
    return {"s": s, "p": p, "g": g, "f": res.stdout.split("Submitted batch job")[-1].split()[0]}


def test_a_failed_scatter_rank_rerun_alone_then_the_later_stages_give_the_same_shards(runs, cluster):
    """What submit.sh's hint says to do: resubmit scatter rank 1 alone (--array=1), then gather and finalize."""
    work, jobs, states, local, hints = runs
    scatter, _plan, _gather, _finalize = jobs["flaky"]
    state = _short(states["flaky"])
    assert {k: v for k, v in state.items() if k.startswith(f"{scatter}_")} == {
        f"{scatter}_0": "COMPLETED", f"{scatter}_1": "FAILED", f"{scatter}_2": "COMPLETED"}, states["flaky"]
    assert {v for k, v in state.items() if not k.startswith(f"{scatter}_")} == {"CANCELLED"}, states["flaky"]
    assert "simulated node failure" in (work / "slurm-logs" / f"shardsmith-scatter-{scatter}_1.out").read_text()
    again = f"RECIPE={work / 'flaky.toml'} SHARDSMITH_WORLD_SIZE=3 sbatch --export=ALL {' '.join(SBATCH_ARGS)}"
    assert f"{again} --parsable --array=R {SUBMIT.parent}/scatter.sbatch" in hints["flaky"], hints["flaky"]

    (work / "healed-scatter").touch()
    ids = _paste(_hint(hints["flaky"], "scatter rank R", 1), cluster, work)
    _wait(cluster, work, time.monotonic())
    state = {k: v for job in ids.values() for k, v in _job_states(job, cluster).items()}
    assert _short(state) == {f"{ids['s']}_1": "COMPLETED", ids["p"]: "COMPLETED",
                             **{f"{ids['g']}_{r}": "COMPLETED" for r in range(3)}, ids["f"]: "COMPLETED"}, \
        f"{state}\n{_logs(work)}"
    # rank 1 of 3, although SLURM_ARRAY_TASK_COUNT is 1 in a one-task array
    assert "rank 1 of 3" in (work / "slurm-logs" / f"shardsmith-scatter-{ids['s']}_1.out").read_text()
    assert _digests(work / "out/flaky") == _digests(local["tokens"])


def test_a_killed_gather_rank_rerun_alone_then_finalize_gives_the_same_shards(runs, cluster):
    """Gather rank 1 is SIGKILLed mid-write: finalize does not start (and, run anyway, names the
    missing shards); rank 1 resubmitted alone, then finalize, give the local run's bytes."""
    work, jobs, states, local, hints = runs
    scatter, plan, gather, finalize = jobs["killed"]
    state = _short(states["killed"])
    assert state == {**{f"{scatter}_{r}": "COMPLETED" for r in range(3)}, plan: "COMPLETED", f"{gather}_0": "COMPLETED",
                     f"{gather}_1": "FAILED", f"{gather}_2": "COMPLETED", finalize: "CANCELLED"}, states["killed"]
    logs = work / "slurm-logs"
    killed = (logs / f"shardsmith-gather-{gather}_1.out").read_text()
    assert "simulated kill mid-write" in killed and ": wrote " not in killed, killed

    # finalize alone, before the rerun: refuses, naming the shards rank 1 should have written
    ids = _paste(_hint(hints["killed"], "finalize", 1), cluster, work)
    _wait(cluster, work, time.monotonic())
    assert _short(_job_states(ids["f"], cluster)) == {ids["f"]: "FAILED"}, _logs(work)
    first = _ranges((logs / f"shardsmith-gather-{gather}_0.out").read_text())[-1][1] + 1  # rank 1's first
    refused = (logs / f"shardsmith-finalize-{ids['f']}.out").read_text()
    assert re.search(rf"split train: shards {first}\.\.\d+ of \d+ are not written", refused), refused
    assert not (work / "out/killed/manifest.json").exists()

    (work / "healed-gather").touch()
    ids = _paste(_hint(hints["killed"], "gather rank R", 1), cluster, work)
    _wait(cluster, work, time.monotonic())
    state = {k: v for job in (ids["g"], ids["f"]) for k, v in _job_states(job, cluster).items()}
    assert _short(state) == {f"{ids['g']}_1": "COMPLETED", ids["f"]: "COMPLETED"}, f"{state}\n{_logs(work)}"
    rerun = (logs / f"shardsmith-gather-{ids['g']}_1.out").read_text()
    assert "rank 1 of 3" in rerun and _ranges(rerun) and _ranges(rerun)[0][0] == first, rerun
    assert _digests(work / "out/killed") == _digests(local["tokens"])
    assert not (work / "out/.killed.shardsmith-work").exists()


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
