"""Running shardsmith as a user does, from a test: in this process through click, or in a child
process that ``SHARDSMITH_CRASH_AT`` kills at a named point; and the digests that compare runs."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
CARD = "README.md"  # the dataset card (shardsmith.kit.dataset_card)


@dataclass(frozen=True)
class Outcome:
    """What a command did: its exit code, standard output and standard error."""

    exit_code: int
    output: str
    stderr: str


def run(args: list[str]) -> Outcome:
    """The command line ``shardsmith ARGS`` in this process, as click runs it from a shell."""
    from click.testing import CliRunner

    from shardsmith.cli import main

    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return Outcome(res.exit_code, res.stdout, res.stderr)


def run_ok(args: list[str]) -> Outcome:
    """``run`` that must succeed; the assertion shows the command and its error line."""
    res = run(args)
    assert res.exit_code == 0, f"shardsmith {' '.join(map(str, args))} exited {res.exit_code}: {res.stderr}"
    return res


def run_killed(args: list[str], point: str) -> None:
    """``shardsmith ARGS`` in a child process with ``SHARDSMITH_CRASH_AT=point``: it must die of
    SIGKILL there, as under the out-of-memory killer (no cleanup runs).

    The child is a fork of this process where there is fork, so it sees the plugins the test
    registered here and starts in milliseconds; elsewhere it is ``python -m shardsmith``.
    """
    args = [str(a) for a in args]
    with tempfile.TemporaryFile(mode="w+") as log:
        if hasattr(os, "fork"):
            returncode = _forked(args, point, log)
        else:  # pragma: no cover - Windows
            env = {**os.environ, "SHARDSMITH_CRASH_AT": point}
            returncode = subprocess.run([sys.executable, "-m", "shardsmith", *args], stdout=log, stderr=log,
                                        env=env, timeout=300).returncode
        log.seek(0)
        said = log.read()
    assert returncode == -signal.SIGKILL, (
        f"SHARDSMITH_CRASH_AT={point} did not kill shardsmith {' '.join(args)} (exit {returncode}): "
        f"{'the point was never reached (are there enough tasks and shards?)' if returncode == 0 else said}")


def _forked(args: list[str], point: str, log: Any) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: run the command, never return into the test
        code = 1
        try:
            os.environ["SHARDSMITH_CRASH_AT"] = point
            os.environ.pop("SHARDSMITH_CRASH_PARENT", None)
            sys.stdout = sys.stderr = log
            from shardsmith.cli import main

            main.main(args=args, prog_name="shardsmith", standalone_mode=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc(file=log)
        finally:
            log.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def manifest(out: Path) -> dict[str, Any]:
    return json.loads((Path(out) / MANIFEST).read_text())


def stable_manifest(out: Path) -> dict[str, Any]:
    """The manifest without what rightly differs between runs of one command: time, command line and
    run identity (which names the output folder)."""
    m = manifest(out)
    m.pop("created", None)
    m.pop("command", None)
    m.pop("run", None)
    return m


def digest(out: Path) -> dict[str, str]:
    """sha256 of every file of a dataset folder (sub-folders too), the manifest and the dataset card
    left out (they record the command line, which differs between the runs compared)."""
    out = Path(out)
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file() and p.name not in (MANIFEST, CARD)}


def listed_files(node: Any) -> list[dict[str, Any]]:
    """Every entry of a manifest that names a file with its size and sha256."""
    if isinstance(node, dict):
        here = [node] if {"path", "bytes", "sha256"} <= node.keys() else []
        return here + [e for v in node.values() for e in listed_files(v)]
    if isinstance(node, list):
        return [e for v in node for e in listed_files(v)]
    return []


def written(m: dict[str, Any]) -> int:
    """Records a manifest says were written: events for event datasets, samples otherwise."""
    return sum(s.get("events", s["samples"]) for s in m["splits"].values())
