"""A prefix of an S3 bucket (``-o s3://bucket/prefix``): what S3 adds to ``objstore.Store``, through
s3fs's ``call_s3`` (boto-level calls): multipart uploads whose parts survive a killed run and are
reused when their size and MD5 match (``list_multipart_uploads``, ``list_parts``), ETags to compare
a local file with an object without downloading it, and conditional puts (``If-None-Match: *``,
``If-Match: ETAG``) for the run record, which is the prefix's lease (``outhold``).

Fenced writes: every write of a run into its prefix is conditional on what the run last
knew of the object, so that a run that lost the prefix (frozen past its heartbeat while another
run took it over) cannot put bytes over another run's object, whatever the timing:

- a new object is put or completed with ``If-None-Match: *`` (``upload``): it never replaces one;
- an object is replaced or removed only by a delete with ``If-Match: <ETag>``, the ETag the run
  listed or wrote (``upload`` with ``known``, ``delete_known``): it can remove only the bytes it
  knew there, never those another run put since;
- the manifest, the commit point, is the one part of a multipart upload opened when the run
  claims the prefix (``open_commit``, ``commit``); a run that takes the prefix over aborts it, so
  the run that lost it cannot commit at all.

An answer that says the object is not what the run knew is ``Changed``: the caller asks whether the
prefix is still its own (``outhold.Hold.check``) and stops if not. An object found with the very
bytes the run was putting (a retried request whose answer was lost) is taken as put.

Why fences: before them, a frozen run overwrote 8-9 objects of the new run in 2 of 2 trials. The
ETags a run may replace or remove are those it listed at its claim or wrote itself (the uploader
keeps them: a split-wide file uploaded again replaces only its own earlier version; ``--overwrite``,
the removal of leftovers and a failed fresh run's cleanup remove only what was listed or written, as
it was). Every claim aborts the other runs' manifest uploads once it holds the record (and removes
a manifest one of them completed in that instant), so a run that lost its prefix cannot commit,
however long it was frozen and even right after its last check. What remains: a frozen run may add
an object under a name the new run never writes (outside its manifest; readers and ``verify``
ignore it, ``--overwrite`` removes it), and could remove an object of the new run only if it held
exactly the bytes the frozen run knew there. Deletes go one request per object (16 at a time): moto,
like S3 before 2025, ignores the ETags of a batch ``DeleteObjects``; moto answers a part or
completion of an aborted upload with a 500 (S3: ``NoSuchUpload``), so the commit asks ``ListParts``
first.

Resume: a file whose object is there with its size and ETag (the MD5, or for a multipart object
the MD5 of the parts' MD5s and ``-N``, computed from the local file with the same part size) is not
uploaded again; of a file with an unfinished multipart upload of its name
(``list_multipart_uploads``, newest first) only the parts whose size and MD5 do not match
(``list_parts``) are uploaded, into that upload. A completion whose answer was lost (retried into
``NoSuchUpload``) is accepted when the object has the expected size and ETag.

Multipart: files up to the part size (64 MiB; ``--part-size`` 5 MiB…5 GiB, grown where a file would
need over 10,000 parts) are one ``put_object``; larger ones ``create_multipart_upload``,
``upload_part`` (parts of every file in parallel, at most 4 held in memory: 256 MiB at the default
size, on top of ``--memory``), ``complete_multipart_upload``. Each body is sent with its
``Content-MD5`` (the store checks it; botocore's own CRC32 is off). The tests use 64 KiB parts
(``SHARDSMITH_PART_SIZE``, bytes, no lower bound: for tests only; moto's server minimum is lowered
to match).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shardsmith.core.faults import crash_point
from shardsmith.errors import UsageError
from shardsmith.storage.errors import s3_code
from shardsmith.storage.objstore import (
    DELETES_IN_FLIGHT,
    PARTS_IN_FLIGHT,
    Changed,
    ObjectInfo,
    Store,
    file_etag,
    part_size_for,
)


class S3Store(Store):
    """A prefix of an S3 bucket, through s3fs's boto-level calls."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.bucket, _, prefix = self.root.partition("/")
        self.prefix = f"{prefix}/" if prefix else ""
        # the parts of every file go up in parallel; at most PARTS_IN_FLIGHT of them held in memory
        self._parts = ThreadPoolExecutor(max_workers=PARTS_IN_FLIGHT, thread_name_prefix="shardsmith-part")
        self._inflight = threading.BoundedSemaphore(PARTS_IN_FLIGHT)
        self._closed = False

    def s3(self, method: str, *, rel: str = "", claiming: bool = False, **kw: Any) -> Any:
        return self.call(lambda: self.fs.call_s3(method, Bucket=self.bucket, **kw), rel=rel, claiming=claiming)

    def list(self) -> dict[str, ObjectInfo]:
        found: dict[str, ObjectInfo] = {}
        token: dict[str, str] = {}
        while True:
            page = self.s3("list_objects_v2", Prefix=self.prefix, claiming=True, **token)
            for o in page.get("Contents", []):
                found[o["Key"][len(self.prefix):]] = ObjectInfo(int(o["Size"]), o["ETag"].strip('"'))
            if not page.get("IsTruncated"):
                return found
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def put(self, rel: str, data: bytes) -> None:
        self.s3("put_object", rel=rel, Key=self.prefix + rel, Body=data)

    def create(self, rel: str, data: bytes) -> str | None:
        """A conditional put (``If-None-Match: *``): of two runs that put at once, one wins."""
        try:
            answer = self.s3("put_object", rel=rel, Key=self.prefix + rel, Body=data, IfNoneMatch="*")
        except FileExistsError:  # s3fs's PreconditionFailed of If-None-Match
            return None
        return str(answer.get("ETag", "")).strip('"')

    def read_tagged(self, rel: str) -> tuple[bytes, str] | None:
        from fsspec.asyn import sync

        async def get() -> tuple[bytes, str]:
            answer = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self.prefix + rel)
            return await answer["Body"].read(), str(answer.get("ETag", "")).strip('"')

        try:
            return self.call(lambda: sync(self.fs.loop, get), rel=rel)
        except UsageError:
            return None  # gone

    def replace(self, rel: str, data: bytes, etag: str) -> str | None:
        """A conditional put (``If-Match``): None when the object has another ETag or is gone."""

        def put() -> str | None:
            try:
                answer = self.fs.call_s3("put_object", Bucket=self.bucket, Key=self.prefix + rel, Body=data,
                                         IfMatch=f'"{etag}"')
            except FileNotFoundError:
                return None
            except OSError as exc:  # s3fs's PreconditionFailed of If-Match (s3fs maps other codes to EINVAL too)
                if s3_code(exc) in ("PreconditionFailed", "412"):
                    return None
                raise
            return str(answer.get("ETag", "")).strip('"')

        return self.call(put, rel=rel)

    def delete(self, rels: list[str]) -> None:
        for i in range(0, len(rels), 1000):
            batch = [{"Key": self.prefix + r} for r in rels[i:i + 1000]]
            self.s3("delete_objects", Delete={"Objects": batch, "Quiet": True})

    def uploads(self) -> dict[str, list[str]]:
        found: dict[str, list[tuple[Any, str]]] = {}
        token: dict[str, str] = {}
        while True:
            page = self.s3("list_multipart_uploads", Prefix=self.prefix, claiming=True, **token)
            for u in page.get("Uploads", []):
                found.setdefault(u["Key"][len(self.prefix):], []).append((u.get("Initiated"), u["UploadId"]))
            if not page.get("IsTruncated"):
                break
            token = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}
        return {rel: [i for _, i in sorted(ups, key=lambda u: str(u[0]), reverse=True)] for rel, ups in found.items()}

    def abort(self, rel: str, upload_ids: list[str]) -> None:
        for upload_id in upload_ids:
            with contextlib.suppress(UsageError):  # gone already
                self.s3("abort_multipart_upload", rel=rel, Key=self.prefix + rel, UploadId=upload_id)

    def parts(self, rel: str, upload_id: str) -> dict[int, ObjectInfo]:
        found: dict[int, ObjectInfo] = {}
        marker: dict[str, int] = {}
        while True:
            page = self.s3("list_parts", rel=rel, Key=self.prefix + rel, UploadId=upload_id, **marker)
            for p in page.get("Parts", []):
                found[int(p["PartNumber"])] = ObjectInfo(int(p["Size"]), p["ETag"].strip('"'))
            if not page.get("IsTruncated"):
                return found
            marker = {"PartNumberMarker": int(page["NextPartNumberMarker"])}

    def head(self, rel: str) -> ObjectInfo | None:
        try:
            answer = self.s3("head_object", rel=rel, Key=self.prefix + rel)
        except UsageError:  # (storage_errors: "no such object")
            return None
        return ObjectInfo(int(answer["ContentLength"]), str(answer.get("ETag", "")).strip('"'))

    def delete_known(self, known: dict[str, str]) -> list[str]:
        """One ``DeleteObject`` with ``If-Match`` per object, a few at once (moto, like S3 before
        2025, ignores the ETags of a batch ``DeleteObjects``)."""

        def one(item: tuple[str, str]) -> str | None:
            rel, etag = item
            how, _ = self._conditional(rel, lambda: self.fs.call_s3("delete_object", Bucket=self.bucket,
                                                                    Key=self.prefix + rel, IfMatch=f'"{etag}"'))
            return rel if how == "changed" else None

        if not known:
            return []
        with ThreadPoolExecutor(max_workers=min(DELETES_IN_FLIGHT, len(known)),
                                thread_name_prefix="shardsmith-delete") as pool:
            return [rel for rel in pool.map(one, sorted(known.items())) if rel is not None]

    def _conditional(self, rel: str, fn: Callable[[], Any]) -> tuple[str, Any]:
        """("done", its answer), ("changed", None) when the store refused the condition (412), or
        ("gone", None) when the object or the upload is not there; other errors as one line."""

        def attempt() -> tuple[str, Any]:
            try:
                return "done", fn()
            except FileExistsError:  # s3fs's PreconditionFailed of If-None-Match
                return "changed", None
            except FileNotFoundError:  # NoSuchKey, NoSuchUpload
                return "gone", None
            except OSError as exc:
                if s3_code(exc) in ("PreconditionFailed", "412"):
                    return "changed", None
                raise

        return self.call(attempt, rel=rel)

    def _created(self, rel: str, want: ObjectInfo, put: Callable[[], Any]) -> ObjectInfo:
        """``put()`` (a put or completion with ``If-None-Match: *``) of an object that must be
        ``want``: refused, it is taken as done only if the object there is ``want`` (a request
        retried after its answer was lost, or the very same bytes), else Changed."""
        how, answer = self._conditional(rel, put)
        if how == "done":
            return ObjectInfo(want.size, str(answer.get("ETag", "")).strip('"') or want.etag)
        if self.head(rel) == want:  # (a completion retried after it was done: "no such upload" now)
            return want
        why = ("another writer put it meanwhile; not replaced" if how == "changed" else
               "its upload was aborted (another run took the prefix over); not put")
        raise Changed(f"-o {self.show(rel)}: {why}", rel=rel)

    def upload(self, rel: str, path: Path, *, known: ObjectInfo | None, resumable: list[str]) -> ObjectInfo | None:
        size = path.stat().st_size
        part = part_size_for(size, self.part_size)
        if known is not None and known.size == size and known.etag == file_etag(path, part):
            return None
        key = self.prefix + rel
        if known is not None:  # the bytes this run knew there, and no others, make room for the new ones
            how, _ = self._conditional(rel, lambda: self.fs.call_s3("delete_object", Bucket=self.bucket, Key=key,
                                                                    IfMatch=f'"{known.etag}"'))
            if how != "done":
                raise Changed(f"-o {self.show(rel)}: {'changed' if how == 'changed' else 'removed'} by another writer "
                              f"since this run knew it; not replaced", rel=rel)
        if size <= part:
            body = path.read_bytes()
            return self._created(rel, ObjectInfo(size, hashlib.md5(body).hexdigest()), lambda: self.fs.call_s3(
                "put_object", Bucket=self.bucket, Key=key, Body=body, ContentMD5=_b64md5(body), IfNoneMatch="*"))
        upload_id, have = None, {}
        for candidate in resumable:  # the newest unfinished upload of this name: its parts may be ours
            with contextlib.suppress(UsageError):
                have, upload_id = self.parts(rel, candidate), candidate
                break
        if upload_id is None:
            upload_id = self.s3("create_multipart_upload", rel=rel, Key=key)["UploadId"]
            self.started.add(upload_id)
        futures, digests = [], []
        with open(path, "rb") as fh:
            for number in range(1, -(-size // part) + 1):
                while not self._inflight.acquire(timeout=0.5):  # parts held in memory, over every upload
                    if self._closed:
                        raise UsageError(f"-o {self.show(rel)}: the upload was stopped")
                try:
                    block = fh.read(part)
                    md5 = hashlib.md5(block)
                    digests.append(md5.digest())
                    if have.get(number) == ObjectInfo(len(block), md5.hexdigest()):
                        self._inflight.release()
                        futures.append(_done(md5.hexdigest()))
                        continue
                    futures.append(self._parts.submit(self._part, rel, key, upload_id, number, block, md5.digest()))
                except BaseException:
                    self._inflight.release()
                    raise
        done = [{"PartNumber": n, "ETag": f'"{f.result()}"'} for n, f in enumerate(futures, 1)]
        want = ObjectInfo(size, f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}")
        got = self._created(rel, want, lambda: self.fs.call_s3(
            "complete_multipart_upload", Bucket=self.bucket, Key=key, UploadId=upload_id,
            MultipartUpload={"Parts": done}, IfNoneMatch="*"))
        self.started.discard(upload_id)
        return got

    def open_commit(self, rel: str) -> str | None:
        return str(self.s3("create_multipart_upload", rel=rel, Key=self.prefix + rel, claiming=True)["UploadId"])

    def commit(self, rel: str, upload_id: str | None, data: bytes) -> None:
        """The manifest as the only part of the upload opened at the claim, completed with
        ``If-None-Match: *``: a run that took the prefix over aborted that upload, so this is
        refused (Changed) to a run that lost it, however long it was frozen."""
        if upload_id is None:
            return super().commit(rel, upload_id, data)
        key = self.prefix + rel
        how, answer = self._conditional(rel, lambda: self.fs.call_s3(
            "list_parts", Bucket=self.bucket, Key=key, UploadId=upload_id))  # (moto answers a part of an
        if how == "done":  # aborted upload with a 500, S3 with NoSuchUpload: asked first, for the one line)
            how, answer = self._conditional(rel, lambda: self.fs.call_s3(
                "upload_part", Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=data,
                ContentMD5=_b64md5(data)))
        if how != "done":
            raise Changed(f"-o {self.show(rel)}: not put: its upload was aborted (another run took the prefix over)",
                          rel=rel)
        part = str(answer["ETag"]).strip('"')
        self._created(rel, ObjectInfo(len(data), f"{hashlib.md5(bytes.fromhex(part)).hexdigest()}-1"),
                      lambda: self.fs.call_s3("complete_multipart_upload", Bucket=self.bucket, Key=key,
                                              UploadId=upload_id, IfNoneMatch="*",
                                              MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": f'"{part}"'}]}))

    def _part(self, rel: str, key: str, upload_id: str, number: int, block: bytes, md5: bytes) -> str:
        try:
            etag = self.s3("upload_part", rel=rel, Key=key, UploadId=upload_id, PartNumber=number, Body=block,
                           ContentMD5=base64.b64encode(md5).decode())["ETag"].strip('"')
        finally:
            self._inflight.release()
        crash_point("upload-part")
        return etag

    def close(self) -> None:
        self._closed = True
        self._parts.shutdown(wait=False, cancel_futures=True)


def _b64md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def _done(value: str) -> Future[str]:
    f: Future[str] = Future()
    f.set_result(value)
    return f
