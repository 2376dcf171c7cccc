"""Object storage under attack (issue 26): kills of ``-o s3://`` runs, two machines' ``--overwrite``
races, kills of the streaming loader's downloads, and frozen writers (issue 42), against a moto
server on loopback. Not a benchmark of speed: a count of outcomes, one run.

    python bench/campaign_storage.py [--kills 30] [--races 20] [--loader-kills 30] [--frozen 5]
                                     [--workdir /tmp/shardsmith-campaign]

- **kills**: ``pack-tokens ... -o s3://campaign/kill`` killed (SIGKILL) at a random moment, then the
  same command run to the end: the bucket must hold the bytes of a local run (every object's
  sha256 the manifest's, the shards the reference's).
- **races**: run 1 (``--seed 1 --staging A``) starts; after a random delay (up to half a run) run 2 (``--seed 2
  --staging B --overwrite``, from another machine: another host name, in a UTS namespace, where
  the campaign runs as root) starts on the same prefix. Whatever each
  exits with, the prefix must hold either nothing committed or one run's whole dataset: the
  manifest's seed and the shards of that seed's reference. A *mix* (both exit 0 and the manifest
  names other bytes) is the failure counted.
- **loader kills**: a reader process iterating an epoch of a streamed ``TokenDataset`` (shards
  downloaded whole, in order, into a shared cache folder bounded to half the dataset, a few ahead,
  the oldest evicted) is killed at a random moment,
  often mid-download; then a fresh reader iterates the epoch through the same cache and must see
  exactly the local dataset's values, in the same order.
- **frozen writers** (issue 42): run 1 (``--seed 1``) is frozen (SIGSTOP) while it uploads: as
  soon as its dataset is made in its staging folder, when the files not up yet are all handed to
  its upload threads; once its heartbeat is older than the lease's 60 s, run 2
  (``--seed 2 --overwrite``, from another machine: another host name) takes the prefix over and
  commits; then run 1 continues (SIGCONT). Counted: objects of run 2 that run 1 replaced or removed
  (the goal: 0), whether run 2's dataset is still whole (its manifest, every object's sha256), how
  run 1 ended, and objects run 1 left outside run 2's manifest. Each trial waits out the lease
  (over a minute). Needs root (the other host name).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
READER = r"""
import sys, numpy as np, shardsmith
cache = dict(cache_dir=sys.argv[2], cache_limit=int(sys.argv[3])) if len(sys.argv) > 2 else {}
ds = shardsmith.TokenDataset(sys.argv[1], seq_len=64, **cache)
h = __import__("hashlib").sha256()
for batch in ds.iter(shuffle=False, batch_size=64):  # in order: shards downloaded whole, a few ahead, old ones evicted
    h.update(np.asarray(batch).tobytes())
print(len(ds), h.hexdigest())
"""


# run 2 of a race as from another machine: its own host name (a UTS namespace: root and util-linux's
# unshare), so the prefix's holder is judged by its heartbeat, not by a pid on this machine
OTHER_HOST = (["unshare", "--uts", "sh", "-c", 'hostname campaign-other && exec "$@"', "sh"]
              if os.geteuid() == 0 and shutil.which("unshare") else [])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shardsmith(*args: str, env: dict[str, str], check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardsmith", *args], env=env, capture_output=True, text=True,
                          timeout=300, check=check)


def digest_of(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in ("manifest.json", "README.md")}


def bucket_state(client, bucket: str, prefix: str) -> tuple[dict | None, dict[str, str]]:
    """The manifest under ``prefix`` (None) and the sha256 of every other object of the dataset."""
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
    manifest, shas = None, {}
    for o in listed:
        rel = o["Key"][len(prefix) + 1:]
        body = client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        if rel == "manifest.json":
            manifest = json.loads(body)
        elif rel != "README.md" and not rel.startswith("."):
            shas[rel] = hashlib.sha256(body).hexdigest()
    return manifest, shas


def consistent(manifest: dict, shas: dict[str, str], references: dict[int, dict[str, str]]) -> bool:
    """The manifest's files are the objects (sha256) and the reference dataset of its seed."""
    ref = references.get(manifest["seed"])
    listed = {s["path"]: s["sha256"] for split in manifest["splits"].values() for s in split["shards"]}
    listed.update({f["path"]: f["sha256"] for f in manifest.get("files") or []})
    return (ref is not None and all(shas.get(p) == h for p, h in listed.items())
            and all(shas.get(p) == h for p, h in ref.items()))


def clear_prefix(client, bucket: str, prefix: str) -> None:
    for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", []):
        client.delete_object(Bucket=bucket, Key=o["Key"])
    for u in client.list_multipart_uploads(Bucket=bucket, Prefix=prefix + "/").get("Uploads", []):
        client.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])


def frozen_writers(trials: int, client, base: list[str], env: dict[str, str], work: Path,
                   references: dict[int, dict[str, str]], span: float, rng: random.Random) -> None:
    """The frozen-writer attack (see the module's docstring), ``trials`` times."""
    from shardsmith.engine.output.outhold import STALE_SECONDS

    if trials and not OTHER_HOST:
        print("frozen writers: skipped (run 2 needs another host name: run as root, with unshare)", flush=True)
        return
    counts: collections.Counter[str] = collections.Counter()
    said: set[str] = set()
    replaced_total = 0
    for trial in range(trials):
        clear_prefix(client, "campaign", "frozen")
        for st in ("st-f1", "st-f2"):
            shutil.rmtree(work / st, ignore_errors=True)
        url = "s3://campaign/frozen"
        one = subprocess.Popen([sys.executable, "-m", "shardsmith", *base, "-o", url, "--seed", "1", "--staging",
                                str(work / "st-f1")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
        deadline = time.monotonic() + 10 * span + 60
        # frozen once its dataset is made locally (its manifest in the staging folder): the files not up yet
        # are all handed to its upload threads at that moment
        while one.poll() is None and time.monotonic() < deadline and not (work / "st-f1" / "manifest.json").exists():
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.02))
        if one.poll() is not None:
            counts["run 1 finished before it could be frozen"] += 1
            print(f"  frozen trial {trial + 1}: run 1 finished before it could be frozen", flush=True)
            continue
        one.send_signal(signal.SIGSTOP)
        while True:  # its heartbeat older than the lease: another machine may take the prefix over
            record = json.loads(client.get_object(Bucket="campaign", Key="frozen/.shardsmith-run.json")["Body"].read())
            if time.time() - record.get("beat", 0) > STALE_SECONDS + 1:
                break
            time.sleep(1)
        two = subprocess.run([*OTHER_HOST, sys.executable, "-m", "shardsmith", *base, "-o", url, "--seed", "2",
                              "--staging", str(work / "st-f2"), "--overwrite"], env=env, capture_output=True,
                             text=True, timeout=300)
        theirs = {o["Key"]: o["ETag"] for o in client.list_objects_v2(Bucket="campaign", Prefix="frozen/")
                  .get("Contents", [])}
        one.send_signal(signal.SIGCONT)
        err1 = one.communicate(timeout=300)[1]
        after = {o["Key"]: o["ETag"] for o in client.list_objects_v2(Bucket="campaign", Prefix="frozen/")
                 .get("Contents", [])}
        replaced = sum(after.get(k) != v for k, v in theirs.items())
        replaced_total += replaced
        manifest, shas = bucket_state(client, "campaign", "frozen")
        whole = manifest is not None and manifest.get("seed") == 2 and consistent(manifest, shas, references)
        outcome = (f"run 2 exit {two.returncode}, run 1 exit {one.returncode}: {replaced} of run 2's objects replaced "
                   f"or removed, run 2's dataset {'whole' if whole else 'NOT WHOLE'}, "
                   f"{len(set(after) - set(theirs))} objects of run 1 left outside it")
        if "Traceback" in err1 + two.stderr:
            outcome += " + traceback"
        counts[outcome] += 1
        said.update(err.strip().splitlines()[-1][:200] for err in (err1, two.stderr)
                    if err.strip() and "Traceback" not in err)
        print(f"  frozen trial {trial + 1}: {outcome}", flush=True)
    print(f"frozen writers ({trials}; lease {STALE_SECONDS:.0f} s): {replaced_total} objects of the new runs "
          f"replaced or removed in all", flush=True)
    for k, v in sorted(counts.items()):
        print(f"  {v:3d}  {k}", flush=True)
    for line in sorted(said):
        print(f"       said: {line}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=30)
    ap.add_argument("--races", type=int, default=20)
    ap.add_argument("--loader-kills", type=int, default=30)
    ap.add_argument("--frozen", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardsmith-campaign"))
    ap.add_argument("--seed", type=int, default=26)
    args = ap.parse_args()
    import boto3

    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rng = random.Random(args.seed)
    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "campaign",
           "AWS_SECRET_ACCESS_KEY": "campaign", "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update({k: env[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION")})
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        client = boto3.client("s3")
        client.create_bucket(Bucket="campaign")
        corpus = work / "corpus"
        corpus.mkdir()
        words = ["alpha", "beta", "gamma", "delta", "shard", "token", "seed", "record"]
        text_rng = random.Random(0)
        for name, n in (("a", 6000), ("b", 5000)):
            with open(corpus / f"{name}.jsonl", "w") as fh:
                for _ in range(n):
                    fh.write(json.dumps({"text": " ".join(text_rng.choice(words) for _ in range(60))}) + "\n")
        shardsmith("pack-tokens", str(corpus), "-o", str(work / "tok"), "--train-tokenizer", "400", "-q", env=env,
                   check=True)
        base = ["pack-tokens", str(corpus), "--tokenizer", str(work / "tok" / "tokenizer.json"), "--shard-tokens",
                "100000", "--memory", "4MB", "--workers", "2", "-q"]
        references = {}
        for seed in (1, 2):
            shardsmith(*base, "-o", str(work / f"ref{seed}"), "--seed", str(seed), env=env, check=True)
            references[seed] = digest_of(work / f"ref{seed}")
        t0 = time.monotonic()
        shardsmith(*base, "-o", "s3://campaign/timing", "--seed", "1", "--staging", str(work / "st-t"), env=env,
                   check=True)
        span = time.monotonic() - t0
        print(f"one -o s3:// run: {span:.2f} s; references made", flush=True)

        kills: collections.Counter[str] = collections.Counter()
        for _ in range(args.kills):
            clear_prefix(client, "campaign", "kill")
            cmd = [*base, "-o", "s3://campaign/kill", "--seed", "1", "--staging", str(work / "st-k")]
            proc = subprocess.Popen([sys.executable, "-m", "shardsmith", *cmd], env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True)
            time.sleep(rng.uniform(0, span))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            again = shardsmith(*cmd, env=env)
            manifest, shas = bucket_state(client, "campaign", "kill")
            if again.returncode != 0:
                kills[f"rerun failed: {again.stderr.strip()[-200:]}"] += 1
            elif manifest is None or not consistent(manifest, shas, {1: references[1]}):
                kills["MIXED or wrong bytes"] += 1
            else:
                kills["resumed to the reference bytes"] += 1
            if "Traceback" in again.stderr:
                kills["traceback"] += 1
        print(f"kills of -o s3:// runs ({args.kills}): {dict(kills)}", flush=True)

        races: collections.Counter[str] = collections.Counter()
        said: set[str] = set()  # the one-line messages the losing runs gave
        for _ in range(args.races):
            clear_prefix(client, "campaign", "race")
            one = subprocess.Popen([sys.executable, "-m", "shardsmith", *base, "-o", "s3://campaign/race", "--seed",
                                    "1", "--staging", str(work / "st-a")], env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
            time.sleep(rng.uniform(0, span / 2))  # (mostly overlapping: run 1 claims after its start-up)
            two = subprocess.Popen([*OTHER_HOST, sys.executable, "-m", "shardsmith", *base, "-o", "s3://campaign/race",
                                    "--seed", "2", "--staging", str(work / "st-b"), "--overwrite"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            err1, err2 = one.communicate(timeout=300)[1], two.communicate(timeout=300)[1]
            manifest, shas = bucket_state(client, "campaign", "race")
            codes = (one.returncode, two.returncode)
            if manifest is None:
                outcome = "nothing committed"
            elif consistent(manifest, shas, references):
                outcome = f"seed {manifest['seed']} whole"
            else:
                outcome = "MIXED"
            if "Traceback" in err1 + err2:
                outcome += " + traceback"
            races[f"exits {codes}: {outcome}"] += 1
            said.update(err.strip().splitlines()[-1][:160] for err in (err1, err2)
                        if err.strip() and "Traceback" not in err)
            for st in ("st-a", "st-b"):
                shutil.rmtree(work / st, ignore_errors=True)
        print(f"two machines' --overwrite races ({args.races}):", flush=True)
        for k, v in sorted(races.items()):
            print(f"  {v:3d}  {k}", flush=True)
        for line in sorted(said):
            print(f"       said: {line}", flush=True)

        frozen_writers(args.frozen, client, base, env, work, references, span, rng)

        loader: collections.Counter[str] = collections.Counter()
        local = work / "ref1"
        want = subprocess.run([sys.executable, "-c", READER, str(local)], capture_output=True, text=True,
                              check=True).stdout.split()
        cache = work / "cache"
        url = "s3://campaign/timing"
        limit = str(sum(p.stat().st_size for p in local.glob("*.bin")) // 2)  # evictions happen
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", READER, url, str(work / "cache-timing"), limit], env=env, check=True,
                       capture_output=True)
        reading = time.monotonic() - t0
        for _ in range(args.loader_kills):
            reader = [sys.executable, "-c", READER, url, str(cache), limit]
            proc = subprocess.Popen(reader, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            time.sleep(rng.uniform(0, reading))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            got = subprocess.run(reader, env=env, capture_output=True, text=True, timeout=300)
            if got.returncode != 0:
                loader[f"reader failed: {got.stderr.strip().splitlines()[-1][:150] if got.stderr.strip() else got.returncode}"] += 1
            elif got.stdout.split() != want:
                loader["WRONG values"] += 1
            else:
                loader["every window right"] += 1
        print(f"kills of a streaming reader ({args.loader_kills}; one epoch {reading:.2f} s): {dict(loader)}", flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
