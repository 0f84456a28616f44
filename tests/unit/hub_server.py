"""A local stand-in of the Hugging Face Hub's HTTP API, enough for huggingface_hub's
`create_repo` and `upload_folder`: repo creation, README metadata validation, the preupload
check (every file "regular", so no LFS or Xet transfer) and the NDJSON commit, whose files
(base64) it keeps in memory. A test points huggingface_hub at it (`hub_endpoint`) and reads
back what was uploaded, byte for byte."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, dict] = {}  # repo id -> {"private": bool, "files": {path: bytes}}
        self.commits: list[dict] = []  # {"repo", "summary", "paths", "token"}
        self.requests: list[str] = []  # "METHOD path" of every request
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            hub.requests.append(f"POST {self.path}")
            path = self.path.split("?")[0]
            if path == "/api/repos/create":
                spec = json.loads(body)
                repo = (
                    f"{spec['organization']}/{spec['name']}"
                    if spec.get("organization")
                    else spec["name"]
                )
                hub.repos.setdefault(
                    repo, {"private": spec.get("visibility") == "private", "files": {}}
                )
                return self._reply(200, {"url": f"{hub.url}/{repo}"})
            if path == "/api/validate-yaml":
                return self._reply(200, {})
            parts = path.split("/")  # /api/models/{org}/{name}/{action}/{revision}
            if len(parts) == 7 and parts[:3] == ["", "api", "models"]:
                repo, action = f"{parts[3]}/{parts[4]}", parts[5]
                if repo not in hub.repos:
                    return self._reply(404, {"error": f"Repository {repo} not found"})
                if action == "preupload":
                    files = json.loads(body)["files"]
                    modes = [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                        for f in files
                    ]
                    return self._reply(200, {"files": modes})
                if action == "commit":
                    return self._commit(repo, body)
            return self._reply(404, {"error": f"no route {path}"})

        def _commit(self, repo: str, body: bytes) -> None:
            lines = [json.loads(x) for x in body.decode().splitlines() if x.strip()]
            header = next(x["value"] for x in lines if x["key"] == "header")
            paths = []
            for item in lines:
                if item["key"] == "file":
                    value = item["value"]
                    hub.repos[repo]["files"][value["path"]] = base64.b64decode(value["content"])
                    paths.append(value["path"])
            token = self.headers.get("authorization", "")
            hub.commits.append(
                {"repo": repo, "summary": header["summary"], "paths": paths, "token": token}
            )
            oid = f"{len(hub.commits):040x}"
            return self._reply(
                200,
                {
                    "commitUrl": f"{hub.url}/{repo}/commit/{oid}",
                    "commitOid": oid,
                    "pullRequestUrl": None,
                },
            )

    return Handler


def serve(monkeypatch):
    """The body of a test's `hub_endpoint` fixture: a running FakeHub that huggingface_hub
    talks to (online, with a token) for that test."""
    import huggingface_hub.constants as constants

    with FakeHub() as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        yield hub
