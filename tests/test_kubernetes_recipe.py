"""recipes/kubernetes/indexed-job.yaml, as far as the commands its pods run: every pod of each
Indexed Job is started here as Kubernetes would start it (its command and args, its env, its working
directory, ``JOB_COMPLETION_INDEX`` set to its index), the pods of a stage at once, a stage after the
one before; the dataset is a local run's, byte for byte. (No Kubernetes runs here: the Jobs' own
fields are checked for what the stages need.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_subprocess, same_dataset, two_file_corpus

yaml = pytest.importorskip("yaml")
RECIPE_DIR = Path(__file__).resolve().parents[1] / "recipes" / "kubernetes"
STAGES = ["shardsmith-scatter", "shardsmith-plan", "shardsmith-gather", "shardsmith-finalize"]


def jobs() -> dict[str, dict]:
    docs = list(yaml.safe_load_all((RECIPE_DIR / "indexed-job.yaml").read_text()))
    return {d["metadata"]["name"]: d for d in docs}


def test_the_jobs_are_indexed_and_agree_on_the_ranks() -> None:
    found = jobs()
    assert list(found) == STAGES
    ranks = {name: int(next(e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
                            if e["name"] == "WORLD_SIZE")) for name, job in found.items()}
    assert len(set(ranks.values())) == 1, ranks  # every stage names the same world size
    for name, job in found.items():
        spec = job["spec"]
        assert (job["apiVersion"], job["kind"], spec["completionMode"]) == ("batch/v1", "Job", "Indexed")
        want = 1 if name.endswith(("plan", "finalize")) else ranks[name]
        assert spec["completions"] == spec["parallelism"] == want, name
        assert spec["template"]["spec"]["restartPolicy"] == "Never"


def pod(job: dict, index: int, *, data: Path, rank_env: str = "JOB_COMPLETION_INDEX") -> subprocess.Popen:
    """One pod of ``job``: its container's command line, env and working folder (``/data`` here is
    ``data``), with the index Kubernetes gives it."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    argv = [*container["command"], *container.get("args", [])]
    assert argv[:3] == ["python", "-m", "shardsmith"], argv
    env = {**os.environ, **{e["name"]: e["value"] for e in container.get("env", [])}, rank_env: str(index)}
    for name in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "RANK"):
        env.pop(name, None)
    cwd = data / Path(container["workingDir"]).relative_to("/data")
    return subprocess.Popen([sys.executable, *argv[1:]], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_the_pods_commands_make_the_local_bytes(tmp_path: Path, bpe_tokenizer: Path) -> None:
    data = tmp_path / "data"  # the volume every pod mounts at /data
    two_file_corpus(data / "corpus", 1800, seed=6, max_words=30, first=800)
    (data / "tokenizer.json").write_bytes(bpe_tokenizer.read_bytes())
    (data / "recipe.toml").write_text('command = "pack-tokens"\ninputs = ["corpus"]\nout = "shards"\n[options]\n'
                                      'tokenizer = "tokenizer.json"\nmemory = "256KB"\nshard-tokens = "12K"\n'
                                      'split = { train = 0.9, val = 0.1 }\nseed = 5\n')
    local = run_subprocess("run", data / "recipe.toml", "--set", f"out={tmp_path / 'local'}",
                           "--set", f"inputs={data / 'corpus'}", "--set", f"tokenizer={data / 'tokenizer.json'}")
    assert local.returncode == 0, local.stderr
    for name, job in jobs().items():
        pods = [pod(job, i, data=data) for i in range(job["spec"]["completions"])]
        results = [(p, *p.communicate(timeout=300)) for p in pods]
        for p, _out, err in results:
            assert p.returncode == 0 and "Traceback" not in err, (name, err)
    assert (data / "shards" / "manifest.json").is_file()
    same_dataset(tmp_path / "local", data / "shards")
