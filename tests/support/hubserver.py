"""A local Hugging Face Hub on 127.0.0.1 for tests and benchmarks: the subset of the Hub API that
`huggingface_hub.snapshot_download` uses, with fault injection.

Endpoints:
  GET  /api/models/{repo}/revision/{rev}[?blobs=true]   model info: id, sha, siblings (+ size, blobId, lfs)
  GET  /api/models/{repo}/tree/{rev}[/{path}]           file list (recursive) with oids and LFS info
  HEAD/GET /{repo}/resolve/{rev}/{file}                 file bytes; X-Repo-Commit, ETag (sha256 for LFS files,
                                                        git blob sha1 otherwise), Content-Length, Range (206)
Errors carry `X-Error-Code`: RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo (401 without a token, 403
with a token that has no access). Faults: `drop[file] = n` cuts the connection after n bytes (once per entry),
`corrupt[file] = k` serves flipped bytes (same length) the next k times, `hide` lists files that answer 404.
`xet` lists files answered as Xet-backed (`X-Xet-Hash` and `X-Xet-Refresh-Route` headers, from which
huggingface_hub's own download hands a file to hf_xet); their bytes are still served over `resolve`.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".model", ".gguf")
_CHUNK = 1 << 18


@dataclass
class HubFile:
    name: str
    size: int
    sha256: str
    blob_id: str  # git blob sha1
    lfs: bool
    data: bytes | None = None
    path: Path | None = None

    def read(self, start: int, end: int) -> bytes:
        if self.data is not None:
            return self.data[start:end]
        with open(self.path, "rb") as f:
            f.seek(start)
            return f.read(end - start)


def _hash_source(src: bytes | Path) -> tuple[int, str, str]:
    if isinstance(src, bytes):
        return len(src), hashlib.sha256(src).hexdigest(), hashlib.sha1(f"blob {len(src)}\0".encode() + src).hexdigest()
    size = Path(src).stat().st_size
    h256, h1 = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())
    with open(src, "rb") as f:
        while chunk := f.read(_CHUNK):
            h256.update(chunk)
            h1.update(chunk)
    return size, h256.hexdigest(), h1.hexdigest()


@dataclass
class HubRepo:
    repo_id: str
    gated: bool = False
    refs: dict[str, str] = field(default_factory=dict)  # branch/tag -> commit sha
    commits: dict[str, dict[str, HubFile]] = field(default_factory=dict)


class LocalHub:
    """In-process Hub server. Use as a context manager; `.endpoint` is its URL."""

    def __init__(self, *, tokens: set[str] | None = None, link_bytes_per_s: float | None = None):
        self.repos: dict[str, HubRepo] = {}
        self.tokens = set(tokens or ())  # tokens with access to gated repos
        self.drop: dict[str, int] = {}
        self.corrupt: dict[str, int] = {}
        self.hide: set[str] = set()  # listed in the model info, but 404 EntryNotFound on download
        self.xet: set[str] = set()  # answered with Xet headers
        self.ignore_range = False  # answer Range requests with the whole file (200), like some CDNs
        self.link_bytes_per_s = link_bytes_per_s  # emulate a network link: aggregate rate over all connections
        self._link_next = 0.0
        self.requests: list[tuple[str, str, str | None, bool]] = []  # (method, path, Range, had Authorization)
        self.bytes_served = 0
        self.first_request_at: float | None = None  # time.monotonic() of the first request / last byte sent since
        self.last_sent_at: float | None = None  # these were last set to None (benchmarks read the phases)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # ---- repository content ------------------------------------------------------------------------------
    def add_commit(self, repo_id: str, files: dict[str, bytes | Path], *, ref: str = "main",
                   gated: bool = False) -> str:
        """Add a commit with `files` (bytes or paths on disk) to `repo_id`, point `ref` at it; returns its sha."""
        repo = self.repos.setdefault(repo_id, HubRepo(repo_id, gated=gated))
        repo.gated = repo.gated or gated
        table = {}
        for name, src in sorted(files.items()):
            size, sha256, blob = _hash_source(src)
            lfs = name.endswith(LFS_SUFFIXES)
            table[name] = HubFile(name, size, sha256, blob, lfs, src if isinstance(src, bytes) else None,
                                  None if isinstance(src, bytes) else Path(src))
        sha = hashlib.sha1(json.dumps([repo_id, ref, len(repo.commits), {n: f.sha256 for n, f in table.items()}])
                           .encode()).hexdigest()
        repo.commits[sha] = table
        repo.refs[ref] = sha
        return sha

    # ---- server --------------------------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        assert self._server is not None, "server not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> LocalHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _pace(self, n: int) -> None:
        """Sleep so that all connections together stay under `link_bytes_per_s`."""
        if not self.link_bytes_per_s:
            return
        with self._lock:
            now = time.monotonic()
            self._link_next = max(self._link_next, now) + n / self.link_bytes_per_s
            wait = self._link_next - now - n / self.link_bytes_per_s  # send this chunk at its slot's start
        if wait > 0:
            time.sleep(wait)

    def file_gets(self, name: str) -> list[str | None]:
        """Range headers of every GET of a file named `name` (None: whole file)."""
        return [r for m, p, r, _ in self.requests if m == "GET" and "/resolve/" in p and p.endswith("/" + name)]


class _Handler(BaseHTTPRequestHandler):
    hub: LocalHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    # ---- helpers ----------------------------------------------------------------------------------------------
    def _error(self, status: int, code: str, message: str = "") -> None:
        body = json.dumps({"error": message or code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        if message:
            self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _repo(self, repo_id: str) -> HubRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
        return repo

    def _commit(self, repo: HubRepo, rev: str) -> str | None:
        sha = rev if rev in repo.commits else repo.refs.get(rev)
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return sha

    def _authorized(self, repo: HubRepo) -> bool:
        if not repo.gated:
            return True
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
        if token in self.hub.tokens:
            return True
        if token is None:
            self._error(401, "GatedRepo", "Access to this model is restricted. You must be authenticated.")
        else:
            self._error(403, "GatedRepo", "Access to this model is restricted and you are not in the authorized list.")
        return False

    # ---- routing ------------------------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def _route(self) -> None:
        url = urlparse(self.path)
        path = unquote(url.path)
        with self.hub._lock:
            self.hub.requests.append((self.command, path, self.headers.get("Range"), "Authorization" in self.headers))
            if self.hub.first_request_at is None:
                self.hub.first_request_at = time.monotonic()
        query = parse_qs(url.query)
        if path.startswith("/api/models/") and "/revision/" in path:
            repo_id, rev = path[len("/api/models/"):].split("/revision/", 1)
            return self._model_info(repo_id, rev, blobs=query.get("blobs") == ["True"] or query.get("blobs") == ["true"])
        if path.startswith("/api/models/") and "/tree/" in path:
            repo_id, rest = path[len("/api/models/"):].split("/tree/", 1)
            rev, _, sub = rest.partition("/")
            return self._tree(repo_id, rev, sub)
        if "/resolve/" in path:
            repo_id, rest = path.lstrip("/").split("/resolve/", 1)
            rev, _, name = rest.partition("/")
            return self._resolve(repo_id, rev, name)
        self._error(404, "NotFound", "unknown endpoint")

    def _sibling(self, f: HubFile, blobs: bool) -> dict:
        if not blobs:
            return {"rfilename": f.name}
        out = {"rfilename": f.name, "size": f.size, "blobId": f.blob_id}
        if f.lfs:
            out["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
        return out

    def _model_info(self, repo_id: str, rev: str, *, blobs: bool) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        sha = self._commit(repo, rev)
        if sha is None:
            return
        files = repo.commits[sha]
        self._json({"_id": sha[:24], "id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
                    "gated": "manual" if repo.gated else False, "disabled": False, "tags": [], "downloads": 0,
                    "likes": 0, "siblings": [self._sibling(f, blobs) for f in files.values()]})

    def _tree(self, repo_id: str, rev: str, sub: str) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        sha = self._commit(repo, rev)
        if sha is None:
            return
        entries = []
        for f in repo.commits[sha].values():
            if sub and not f.name.startswith(sub.rstrip("/") + "/"):
                continue
            e = {"type": "file", "oid": f.blob_id, "size": f.size, "path": f.name}
            if f.lfs:
                e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
            entries.append(e)
        self._json(entries)

    def _resolve(self, repo_id: str, rev: str, name: str) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        sha = self._commit(repo, rev)
        if sha is None or not self._authorized(repo):
            return
        f = repo.commits[sha].get(name)
        if f is None or name in self.hub.hide:
            return self._error(404, "EntryNotFound", f"{name} does not exist on {rev}")
        start, end, status = 0, f.size, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and not self.hub.ignore_range:
            a, _, b = rng[len("bytes="):].partition("-")
            start = int(a) if a else 0
            end = min(int(b) + 1, f.size) if b else f.size
            status = 206
        self.send_response(status)
        self.send_header("X-Repo-Commit", sha)
        self.send_header("ETag", f'"{f.sha256 if f.lfs else f.blob_id}"')
        self.send_header("Accept-Ranges", "bytes")
        if name in self.hub.xet:
            self.send_header("X-Xet-Hash", hashlib.sha256(b"xet " + f.sha256.encode()).hexdigest())
            self.send_header("X-Xet-Refresh-Route", f"{self.hub.endpoint}/api/models/{repo_id}/xet-read-token/{sha}")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{f.size}")
        self.end_headers()
        if self.command == "HEAD":
            return
        with self.hub._lock:
            drop_at = self.hub.drop.pop(name, None)
            corrupt = self.hub.corrupt.get(name, 0) > 0
            if corrupt:
                self.hub.corrupt[name] -= 1
        pos = start
        while pos < end:
            stop = min(end, pos + _CHUNK)
            if drop_at is not None and stop > drop_at > pos:
                stop = drop_at
            chunk = f.read(pos, stop)
            if corrupt:
                chunk = bytes(b ^ 0xFF for b in chunk[:64]) + chunk[64:]
                corrupt = False
            self.hub._pace(len(chunk))
            self.wfile.write(chunk)
            pos = stop
            with self.hub._lock:
                self.hub.bytes_served += len(chunk)
                self.hub.last_sent_at = time.monotonic()
            if drop_at is not None and pos >= drop_at:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)  # SHUT_RDWR: the client sees a connection cut mid-file
                return


def serve_directory(hub: LocalHub, repo_id: str, directory: Path, **kw) -> str:
    """Publish every regular file of `directory` (top level) as one commit of `repo_id`; returns the commit sha."""
    files = {p.name: p for p in sorted(Path(directory).iterdir()) if p.is_file() and p.name != "manifest.json"}
    return hub.add_commit(repo_id, files, **kw)


if __name__ == "__main__":  # python -m tests.support.hubserver DIR REPO_ID: serve a directory until Ctrl-C
    import sys

    hub = LocalHub().start()
    print(serve_directory(hub, sys.argv[2], Path(sys.argv[1])), hub.endpoint, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        hub.stop()
    os._exit(0)
