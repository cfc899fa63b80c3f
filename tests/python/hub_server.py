"""A local server speaking the Hugging Face Hub's file and revision API, for the hub tests.

    hub_server.py CONFIG.json

CONFIG: {"port": P, "log": FILE, "token": "hf_...",
         "repos": {"org/name": {"dir": DIR, "gated": false}},
         "cut": {"org/name/FILE": BYTES}, "corrupt": ["org/name/FILE"]}

What it serves, as huggingface.co does:
- `GET /api/models/{repo}` and `/api/models/{repo}/revision/{rev}`: the repo's commit `sha` and its
  `siblings`; `/api/models/{repo}/tree/{rev}`: its files (huggingface_hub's `snapshot_download`
  lists them so); a revision other than `main` or the commit is 404 `RevisionNotFound`.
- `GET`/`HEAD /{repo}/resolve/{rev}/{file}` with `Range`: the bytes, `X-Repo-Commit`, `ETag` (the
  sha256 of an LFS file, weights and anything over 1 MB, also as `X-Linked-Etag`/`X-Linked-Size`;
  the git blob sha1 of a small file), `Content-Range` on 206.
- A gated repo answers 401 `GatedRepo` without `Authorization: Bearer <token>`, 403 with another.
- `cut`: the first download of that file from its start stops after BYTES and drops the connection.
- `corrupt`: that file's bytes are served with one byte changed (its hashes are the true ones).
Every request is logged to `log` as a JSON line: method, path, range, whether a token came.
"""

import hashlib
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

LFS_MIN = 1 << 20


def describe(repo_dir):
    files = {}
    for root, _, names in os.walk(repo_dir):
        for n in names:
            path = os.path.join(root, n)
            rel = os.path.relpath(path, repo_dir)
            size = os.path.getsize(path)
            lfs = size >= LFS_MIN or rel.endswith((".safetensors", ".gguf"))
            h = hashlib.sha256() if lfs else hashlib.sha1(b"blob %d\0" % size)
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            files[rel] = {"path": path, "size": size, "etag": h.hexdigest(), "lfs": lfs}
    listing = "".join(f"{k}:{v['etag']}\n" for k, v in sorted(files.items()))
    return {"files": files, "sha": hashlib.sha1(listing.encode()).hexdigest()}


def tree(repo, under):
    """`/api/models/{repo}/tree/{rev}/{path}?recursive=true`: the files under `path`."""
    entries, dirs = [], set()
    for name, f in sorted(repo["files"].items()):
        if under and not name.startswith(under.rstrip("/") + "/"):
            continue
        parts = name.split("/")
        for i in range(1, len(parts)):
            dirs.add("/".join(parts[:i]))
        entry = {"type": "file", "oid": hashlib.sha1(f["etag"].encode()).hexdigest(), "size": f["size"], "path": name}
        if f["lfs"]:
            entry["lfs"] = {"oid": f["etag"], "size": f["size"], "pointerSize": 134}
        entries.append(entry)
    entries += [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
                for d in sorted(dirs) if not under or d.startswith(under)]
    return entries


class Hub:
    def __init__(self, config):
        self.config = config
        self.repos = {name: {**describe(r["dir"]), **r} for name, r in config["repos"].items()}
        self.cut = dict(config.get("cut", {}))
        self.corrupt = set(config.get("corrupt", []))
        self.lock = threading.Lock()
        self.log = open(config["log"], "a", buffering=1)

    def note(self, **entry):
        with self.lock:
            self.log.write(json.dumps(entry) + "\n")

    def take_cut(self, key):
        with self.lock:
            return self.cut.pop(key, None)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub = None

    def log_message(self, *args):
        pass

    def reply(self, status, body=b"", headers=(), error=None):
        self.send_response(status)
        if error:
            self.send_header("X-Error-Code", error[0])
            self.send_header("X-Error-Message", error[1])
            body = json.dumps({"error": error[1]}).encode()
        self.send_header("Content-Type", "application/json" if error or body[:1] == b"{" else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def repo_and_rest(self, parts):
        for n in (2, 1):
            name = "/".join(parts[:n])
            if name in self.hub.repos:
                return name, self.hub.repos[name], parts[n:]
        return None, None, parts

    def allowed(self, name, repo):
        if not repo.get("gated"):
            return True
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            self.reply(401, error=("GatedRepo", f"Access to model {name} is restricted. You must have access to it and be authenticated to access it. Please log in."))
            return False
        if auth[len("Bearer "):] != self.hub.config["token"]:
            self.reply(403, error=("GatedRepo", f"Access to model {name} is restricted and you are not in the authorized list."))
            return False
        return True

    def revision_ok(self, name, repo, rev):
        if rev in ("main", repo["sha"]):
            return True
        self.reply(404, error=("RevisionNotFound", f"Invalid rev id: {rev}"))
        return False

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        path = unquote(self.path.split("?", 1)[0])
        self.hub.note(method=self.command, path=path, range=self.headers.get("Range"),
                      token="Authorization" in self.headers)
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "models"]:
            name, repo, rest = self.repo_and_rest(parts[2:])
            if repo is None:
                return self.reply(404, error=("RepoNotFound", f"Repository {'/'.join(parts[2:])} not found"))
            rev = rest[1] if rest[:1] in (["revision"], ["tree"]) and len(rest) > 1 else "main"
            if not self.allowed(name, repo) or not self.revision_ok(name, repo, rev):
                return
            if rest[:1] == ["tree"]:
                return self.reply(200, json.dumps(tree(repo, "/".join(rest[2:]))).encode())
            info = {"_id": repo["sha"][:24], "id": name, "modelId": name, "sha": repo["sha"], "private": False,
                    "gated": "manual" if repo.get("gated") else False, "tags": [],
                    "siblings": [{"rfilename": f} for f in sorted(repo["files"])]}
            return self.reply(200, json.dumps(info).encode())
        name, repo, rest = self.repo_and_rest(parts)
        if repo is None or len(rest) < 3 or rest[0] != "resolve":
            return self.reply(404, error=("RepoNotFound", f"Repository not found: {path}"))
        rev, file = rest[1], "/".join(rest[2:])
        if not self.allowed(name, repo) or not self.revision_ok(name, repo, rev):
            return
        f = repo["files"].get(file)
        if f is None:
            return self.reply(404, error=("EntryNotFound", f"{file} does not exist on \"{rev}\""))
        self.send_file(f"{name}/{file}", repo["sha"], f)

    def send_file(self, key, sha, f):
        size, start, end = f["size"], 0, f["size"] - 1
        rng = self.headers.get("Range")
        if rng:
            a, _, b = rng.removeprefix("bytes=").partition("-")
            start, end = int(a), min(int(b), size - 1) if b else size - 1
            if start >= size:
                return self.reply(416, headers=[("Content-Range", f"bytes */{size}")])
        headers = [("X-Repo-Commit", sha), ("ETag", f'"{f["etag"]}"'), ("Accept-Ranges", "bytes")]
        if f["lfs"]:
            headers += [("X-Linked-Etag", f'"{f["etag"]}"'), ("X-Linked-Size", str(size))]
        self.send_response(206 if rng else 200)
        for k, v in headers:
            self.send_header(k, v)
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if self.command == "HEAD":
            return
        cut = self.hub.take_cut(key) if start == 0 and end > 0 else None
        with open(f["path"], "rb") as src:
            src.seek(start)
            data = bytearray(src.read(end - start + 1))
        if key in self.hub.corrupt and start <= size // 2 <= end:
            data[size // 2 - start] ^= 0x5A
        if cut is not None:
            self.wfile.write(data[:cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(data)


def main(config_path):
    with open(config_path) as f:
        config = json.load(f)
    Handler.hub = Hub(config)
    server = ThreadingHTTPServer(("127.0.0.1", config["port"]), Handler)
    print("listening", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1])
