"""A loopback stand-in for the few Hugging Face Hub API routes `laguna-gguf upload` uses.

It listens on 127.0.0.1 with an ephemeral port, records every request (method, path,
query, headers, body), keeps repositories, branches and committed files in memory,
and answers like the Hub does for:

    GET  /api/agent-harnesses                         huggingface_hub's public agent registry (no auth)
    GET  /api/models/{owner}/{name}                   repository info (404 RepoNotFound when missing)
    POST /api/repos/create                            create (409 when it exists)
    POST /api/models/{owner}/{name}/branch/{branch}   create a branch (409 when it exists)
    POST /api/models/{owner}/{name}/preupload/{rev}   upload mode: always "regular"
    POST /api/validate-yaml                           accept the card's front matter
    POST /api/models/{owner}/{name}/commit/{rev}      NDJSON commit; regular files arrive base64 inline

Because every file is "regular", the committed bytes arrive in the commit body and a
test can hash them. Anything else answers 404 and is recorded too. It is bounded: at
most `max_requests` requests and `max_body` bytes per body; each connection times out.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        """A request header, looked up case-insensitively (HTTP header names are)."""
        return next((v for k, v in self.headers.items() if k.lower() == name.lower()), None)

    def json(self) -> Any:
        return json.loads(self.body)

    def ndjson(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.body.splitlines() if line.strip()]


@dataclass
class Repo:
    repo_id: str
    private: bool
    branches: dict[str, dict[str, bytes]] = field(default_factory=dict)
    commits: list[dict[str, Any]] = field(default_factory=list)


class HubStandIn:
    def __init__(self, token: str | None = None, max_requests: int = 200, max_body: int = 64 << 20) -> None:
        #: When set, every request must carry `Authorization: Bearer <token>`, else 401.
        self.token = token
        self.max_requests = max_requests
        self.max_body = max_body
        #: operation name ("info", "create", "branch", "preupload", "validate", "commit") -> HTTP status to answer.
        self.refuse: dict[str, int] = {}
        self.requests: list[Request] = []
        self.repos: dict[str, Repo] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "HubStandIn":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------------ helpers for tests

    def add_repo(self, repo_id: str, private: bool = False, files: dict[str, bytes] | None = None) -> Repo:
        repo = Repo(repo_id, private, {"main": {".gitattributes": b"*.gguf filter=lfs diff=lfs merge=lfs -text\n"}})
        repo.branches["main"].update(files or {})
        self.repos[repo_id] = repo
        return repo

    def calls(self, method: str | None = None, contains: str = "") -> list[Request]:
        return [r for r in self.requests if (method is None or r.method == method) and contains in r.path]

    # ------------------------------------------------------------------ routing

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                return

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length > hub.max_body:
                    self._reply(413, {"error": "body too large for the stand-in"})
                    return
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                req = Request(self.command, parts.path, parse_qs(parts.query), dict(self.headers.items()), body)
                with hub._lock:
                    if len(hub.requests) >= hub.max_requests:
                        self._reply(503, {"error": "stand-in request budget exhausted"})
                        return
                    hub.requests.append(req)
                    status, payload, headers = hub._route(req)
                self._reply(status, payload, headers)

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve

            def _reply(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

        return Handler

    def _error(self, status: int, message: str, code: str | None = None) -> tuple[int, Any, dict[str, str]]:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        return status, {"error": message}, headers

    def _route(self, req: Request) -> tuple[int, Any, dict[str, str]]:
        segs = [unquote(s) for s in req.path.strip("/").split("/")]
        if req.method == "GET" and segs == ["api", "agent-harnesses"]:
            # huggingface_hub fetches this public registry (no token) to fill its user-agent.
            return 200, {"standardEnvVars": [], "harnesses": {}}, {}
        if self.token is not None and req.header("Authorization") != f"Bearer {self.token}":
            return self._error(401, "Invalid credentials in Authorization header")

        if req.method == "POST" and segs == ["api", "repos", "create"]:
            if "create" in self.refuse:
                return self._error(self.refuse["create"], "You don't have the rights to create a model under this namespace")
            body = req.json()
            repo_id = f"{body.get('organization')}/{body['name']}" if body.get("organization") else body["name"]
            if repo_id in self.repos:
                return self._error(409, "You already created this model repo")
            self.add_repo(repo_id, private=body.get("visibility") == "private" or bool(body.get("private")))
            return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id}, {}

        if req.method == "POST" and segs == ["api", "validate-yaml"]:
            if "validate" in self.refuse:
                return self._error(self.refuse["validate"], "invalid metadata")
            content = req.json().get("content", "")
            if not content.startswith("---\n"):
                return 400, {"errors": [{"message": "no YAML front matter"}], "warnings": []}, {}
            return 200, {"errors": [], "warnings": []}, {}

        if len(segs) >= 4 and segs[:2] == ["api", "models"]:
            repo_id = f"{segs[2]}/{segs[3]}"
            rest = segs[4:]
            repo = self.repos.get(repo_id)
            if req.method == "GET" and (not rest or rest[0] == "revision"):
                if "info" in self.refuse:
                    return self._error(self.refuse["info"], "refused")
                if repo is None:
                    return self._error(404, "Repository not found", "RepoNotFound")
                files = repo.branches["main"]
                return 200, {
                    "id": repo_id,
                    "modelId": repo_id,
                    "sha": hashlib.sha1(repr(sorted(files)).encode()).hexdigest(),
                    "private": repo.private,
                    "siblings": [{"rfilename": name} for name in files],
                }, {}
            if repo is None:
                return self._error(404, "Repository not found", "RepoNotFound")
            if req.method == "POST" and len(rest) == 2 and rest[0] == "branch":
                if "branch" in self.refuse:
                    return self._error(self.refuse["branch"], "refused")
                if rest[1] in repo.branches:
                    return self._error(409, "Reference already exists")
                repo.branches[rest[1]] = dict(repo.branches["main"])
                return 200, {}, {}
            if req.method == "POST" and len(rest) == 2 and rest[0] == "preupload":
                if "preupload" in self.refuse:
                    return self._error(self.refuse["preupload"], "You don't have the rights to upload here")
                files = req.json()["files"]
                return 200, {
                    "files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
                }, {}
            if req.method == "POST" and len(rest) == 2 and rest[0] == "commit":
                if "commit" in self.refuse:
                    return self._error(self.refuse["commit"], "You don't have the rights to push to this repository")
                rev = rest[1]
                if rev not in repo.branches:
                    return self._error(404, "Revision not found", "RevisionNotFound")
                return self._commit(repo, rev, req)
        return self._error(404, f"the stand-in does not serve {req.method} {req.path}")

    def _commit(self, repo: Repo, rev: str, req: Request) -> tuple[int, Any, dict[str, str]]:
        lines = req.ndjson()
        if not lines or lines[0].get("key") != "header":
            return 400, {"error": "commit without header"}, {}
        added: dict[str, bytes] = {}
        for item in lines[1:]:
            value = item.get("value", {})
            if item.get("key") == "file" and value.get("encoding") == "base64":
                added[value["path"]] = base64.b64decode(value["content"])
            else:
                return 400, {"error": f"the stand-in only takes inline files, got {item.get('key')}"}, {}
        repo.branches[rev].update(added)
        oid = hashlib.sha1(json.dumps([rev, len(repo.commits), sorted(added)]).encode()).hexdigest()
        repo.commits.append({"revision": rev, "header": lines[0]["value"], "files": added, "oid": oid})
        return 200, {"commitUrl": f"{self.url}/{repo.repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}, {}
