"""http:// and https:// inputs (issue 15, part 1) from a real web server: ``http.server`` in a thread,
answering Range requests with 206 and giving an ETag, as object stores and CDNs do. The same code
path serves https:// (only the transport differs). A folder is the server's page of links, named
with its final slash; its files are staged and converted, and the output equals a local run's.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
from conftest import make_docs, run_cli, tree_digest, write_jsonl

from shardsmith.errors import install_hint

pytest.importorskip("aiohttp", reason="http:// inputs need aiohttp (pip install 'shardsmith[http]')")


class RangeHandler(SimpleHTTPRequestHandler):
    """http.server's file handler, plus ``Range: bytes=A-B`` (206) and an ETag (mtime and size)."""

    def log_message(self, *args: object) -> None:
        pass

    def send_head(self):  # type: ignore[no-untyped-def]
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            return super().send_head()  # folders: the page of links
        st = os.stat(path)
        size = st.st_size
        asked = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        start, stop = (int(asked.group(1)), min(int(asked.group(2) or size - 1) + 1, size)) if asked else (0, size)
        fh = open(path, "rb")  # noqa: SIM115 (http.server closes it)
        fh.seek(start)
        self._left = stop - start
        self.send_response(206 if asked else 200)
        if asked:
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{st.st_mtime_ns:x}-{size:x}"')
        self.end_headers()
        return fh

    def copyfile(self, source, outputfile) -> None:  # type: ignore[no-untyped-def]
        left = getattr(self, "_left", None)
        while left is None or left > 0:
            block = source.read(1 << 16 if left is None else min(1 << 16, left))
            if not block:
                break
            outputfile.write(block)
            if left is not None:
                left -= len(block)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        pass  # a client that closes a connection early (fsspec, once it has the bytes it asked for)


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[str, Path]]:
    """``(base URL, served folder)``."""
    root = tmp_path / "www"
    root.mkdir()
    server = _Server(("127.0.0.1", 0), functools.partial(RangeHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


def test_a_folder_page_and_one_file_convert_as_their_local_copies(served, tmp_path):
    base, root = served
    local = root / "corpus"
    write_jsonl(local / "a.jsonl", make_docs(120, seed=1))
    write_jsonl(local / "sub" / "b.jsonl", make_docs(2000, seed=2))  # several ranged reads with --memory 256KB
    (local / "notes.txt").write_text("not an input")
    common = ["--to", "webdataset", "--workers", "2", "--seed", "5", "--memory", "256KB", "-q"]
    assert run_cli("convert", local, "-o", tmp_path / "ref", *common).exit_code == 0
    got = run_cli("convert", f"{base}/corpus/", "-o", tmp_path / "got", *common)
    assert got.exit_code == 0, got.stderr
    assert tree_digest(tmp_path / "ref") == tree_digest(tmp_path / "got")
    source = orjson.loads((tmp_path / "got" / "manifest.json").read_bytes())["source"]
    assert source["inputs"] == ["a.jsonl", "sub/b.jsonl"]
    assert source["input_root"] == f"{base}/corpus/"
    # one file, named with a query string (a signed URL): staged and shown without it
    one = run_cli("convert", f"{base}/corpus/sub/b.jsonl?X-Signature=secret42", "-o", tmp_path / "one", *common)
    assert one.exit_code == 0, one.stderr
    assert run_cli("convert", local / "sub" / "b.jsonl", "-o", tmp_path / "ref-one", *common).exit_code == 0
    assert tree_digest(tmp_path / "ref-one") == tree_digest(tmp_path / "one")
    manifest = (tmp_path / "one" / "manifest.json").read_text()
    assert "secret42" not in manifest and f"{base}/corpus/sub/" in manifest


def test_a_missing_file_is_one_line(served, tmp_path):
    base, _ = served
    res = run_cli("convert", f"{base}/nothing.jsonl", "-o", tmp_path / "out", "--to", "webdataset", "-q")
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert lines == [f"shardsmith: error: {base}/nothing.jsonl: no such object or prefix"], res.stderr


_BLOCK = """
import sys
BLOCKED = sys.argv[1]
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == BLOCKED:
            raise ModuleNotFoundError(f"No module named {BLOCKED!r}", name=BLOCKED)
sys.meta_path.insert(0, Block())
from shardsmith.program import main
sys.argv = ["shardsmith"] + sys.argv[2:]
main()
"""


@pytest.mark.parametrize("url, module, extra", [("https://example.org/data/a.jsonl", "aiohttp", "http"),
                                                ("gs://bucket/data/", "gcsfs", "gcs")])
def test_a_missing_client_names_the_extra(tmp_path, url, module, extra):
    res = subprocess.run([sys.executable, "-c", _BLOCK, module, "convert", url, "-o", str(tmp_path / "out"),
                          "--to", "webdataset"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    scheme = url.split(":", 1)[0]
    assert res.stderr.strip() == (f"shardsmith: error: {url}: reading {scheme}:// needs {module}: "
                                  f"{install_hint(extra)}"), res.stderr
