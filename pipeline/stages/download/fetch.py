"""One file from the Hub, hashed while it is written.

`fetch_file` streams a `resolve` URL through huggingface_hub's public HTTP session (`get_session`, headers from
`build_hf_headers`, errors from `hf_raise_for_status`) into `<dest>.incomplete`, resuming from the bytes already
there, and renames it to `dest` once the whole file arrived. The sha256 it returns is computed from exactly the
bytes in that file: the ones already on disk when resuming, then every chunk as it is written. The Hub serves every
file over its `resolve` URL whatever storage backs it (git, LFS or Xet: a Xet-backed file redirects to an HTTP
bridge), so one code path, and one check, covers them all.

The digest is off the download's critical path: each file's writer hands its chunks (immutable bytes) to that
file's hashing thread and goes back to the socket at once; the bounded queue only makes it wait when hashing falls
behind the network.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from pathlib import Path
from typing import BinaryIO, Callable

# Read size: huggingface_hub reads 10 MiB at a time; with chunks queued for the hasher that many fresh 10 MiB buffers
# page-fault ~10x more (56-105k vs 5-7k minor faults per GiB measured) for no gain in throughput.
CHUNK_BYTES = 1 << 20
HASH_QUEUE_CHUNKS = 16  # per file: at most this many chunks wait for the hasher


class Hasher:
    """sha256 of a byte stream computed on its own thread; `update` only enqueues."""

    def __init__(self):
        self._h = hashlib.sha256()
        self._q: queue.Queue = queue.Queue(maxsize=HASH_QUEUE_CHUNKS)
        self._thread = threading.Thread(target=self._run, name="download-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._q.get()) is not None:
            self._h.update(chunk)

    def update(self, data: bytes) -> None:
        self._q.put(bytes(data))  # a copy only when the writer passed a mutable buffer

    def hexdigest(self) -> str:
        """The digest of everything updated so far (waits for the thread; the hasher is finished after)."""
        if self._thread.is_alive():
            self._q.put(None)
            self._thread.join()
        return self._h.hexdigest()


class HashingFile:
    """Appends to an open file and hashes what it holds: first the `resume_size` bytes already in it, then every
    `write`. `clean` is False when those first bytes could not all be read back (the digest is then not the file's)."""

    def __init__(self, f: BinaryIO, resume_size: int):
        self._f, self.name = f, f.name
        self._h, self.size, self.clean = Hasher(), 0, True
        if resume_size:
            with open(f.name, "rb") as r:
                while self.size < resume_size and (chunk := r.read(min(1 << 20, resume_size - self.size))):
                    self._h.update(chunk)
                    self.size += len(chunk)
            self.clean = self.size == resume_size

    def write(self, data: bytes) -> int:
        n = self._f.write(data)
        self._h.update(data)
        self.size += len(data)
        return n

    def digest(self) -> str:
        return self._h.hexdigest()


def fetch_file(url: str, dest: Path, *, headers: dict[str, str], size: int | None,
               progress: Callable[[int], object] = lambda n: None) -> str | None:
    """Download `url` to `dest` through `<dest>.incomplete` (resumed when it exists); returns the sha256 of the
    bytes written to `dest`, or None when the resumed part could not be hashed (check `dest` from disk).
    `progress` is called with the size of every chunk received.

    Raises:
        requests.ConnectionError: the stream ended before `size` bytes (also a dropped connection or a timeout:
            requests' own exceptions); `<dest>.incomplete` keeps what arrived, a later call resumes from it. A
            longer file is kept: the caller's size check rejects it.
        huggingface_hub.errors.HfHubHTTPError: the Hub refused the request (404, gated, ...).
    """
    import requests

    part = dest.with_name(dest.name + ".incomplete")
    with open(part, "ab") as f:
        have = f.tell()
        if size is not None and have > size:  # not a prefix of this file
            f.truncate(0)
            have = 0
        if size is not None and have == size:  # complete already (killed before the rename)
            stream = HashingFile(f, have)
        else:
            stream = _get(f, url, headers, have, progress)
        digest = stream.digest()  # always ends the hashing thread
    if size is not None and stream.size < size:
        raise requests.ConnectionError(f"{url}: the stream ended after {stream.size} of {size} bytes")
    os.replace(part, dest)
    return digest if stream.clean else None


def _get(f: BinaryIO, url: str, headers: dict[str, str], have: int, progress: Callable[[int], object]) -> HashingFile:
    """Stream `url` into `f` from byte `have` (from 0 when the server ignores the Range header)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session, hf_raise_for_status

    if have:
        headers = {**headers, "Range": f"bytes={have}-"}
    with get_session().get(url, headers=headers, stream=True, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as r:
        hf_raise_for_status(r)
        if have and r.status_code != 206:  # a whole-file answer: start over
            f.truncate(0)
            have = 0
        stream = HashingFile(f, have)
        try:
            for chunk in r.iter_content(chunk_size=CHUNK_BYTES):
                stream.write(chunk)
                progress(len(chunk))
        except BaseException:
            stream.digest()  # ends the hashing thread
            raise
    return stream
