"""A loopback stand-in for the hosts ``weights pull`` talks to, on 127.0.0.1 in a thread of the test process:

- ``/hub``: the few Hugging Face hub routes huggingface_hub calls (``HF_ENDPOINT``): ``resolve/{revision}/{file}``
  (HEAD and GET with ``X-Repo-Commit``, ``ETag``, ``Content-Length``, ``Range``), ``api/models/{repo}[/revision/
  {revision}]``; gated repositories answer 401 or 403 as the hub does, a missing file 404 ``EntryNotFound``;
- ``/drive``: Google Drive's ``embeddedfolderview?id=`` listing page and ``uc?id=`` file downloads (``Range`` too);
- ``/raw``: raw.githubusercontent.com's ``{org}/{repo}/{commit}/{path}``; ``/github-api``: api.github.com's
  ``repos/{org}/{repo}/git/trees/{commit}?recursive=1`` listing those files;
- ``/kaggle``: the Kaggle API routes the ``kaggle`` client calls (``XBENCH_KAGGLE_URL``): POST
  ``v1/competitions.CompetitionApiService/DownloadDataFile`` and ``v1/datasets.DatasetApiService/DownloadDataset``
  (basic auth with ``kaggle_login``, else 401; a refused competition or dataset 403 as Kaggle's JSON error), answered
  by a redirect to ``/kaggle-files/...`` (``Range``, ``Last-Modified``);
- ``/physionet``: physionet.org's ``files/{project}/{version}/{path}`` behind basic auth (``physionet_login``; a
  project in ``physionet_refused``: 403, as for an account without its data use agreement);
- ``/plain``: any other host's plain files.

Faults: ``drop`` (paths whose first GET ends half way through, the connection closed), ``stall`` (paths whose GETs send
half the file and then hang). ``requests`` logs ``(method, path, Range header)``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Hosts:
    def __init__(self):
        self.hub: dict[str, dict[str, bytes]] = {}  # repo -> file -> bytes
        self.gated: dict[str, int] = {}  # repo -> 401 or 403
        self.drive_files: dict[str, tuple[str, bytes]] = {}  # id -> (name, bytes)
        self.drive_folders: dict[str, tuple[str, list[str]]] = {}  # id -> (title, child ids: files or folders)
        self.raw: dict[str, bytes] = {}  # "org/repo/commit/path" -> bytes
        self.kaggle: dict[str, dict[str, bytes]] = {}  # "competitions/NAME" or "datasets/OWNER/NAME" -> file -> bytes
        self.kaggle_refused: set[str] = set()
        self.kaggle_login = ("tester", "kaggle-key")
        self.physionet: dict[str, bytes] = {}  # "project/version/path" -> bytes
        self.physionet_refused: set[str] = set()  # "project/version"
        self.physionet_login = ("reader", "physionet-secret")
        self.plain: dict[str, bytes] = {}  # path -> bytes
        self.drop: set[str] = set()
        self.stall: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def environ(self) -> dict[str, str]:
        """The environment that points ``weights pull`` here."""
        return {"HF_ENDPOINT": f"{self.url}/hub", "XBENCH_DRIVE_URL": f"{self.url}/drive",
                "XBENCH_GITHUB_RAW_URL": f"{self.url}/raw", "XBENCH_GITHUB_API_URL": f"{self.url}/github-api",
                "XBENCH_KAGGLE_URL": f"{self.url}/kaggle", "XBENCH_PHYSIONET_URL": f"{self.url}/physionet",
                "HF_HUB_OFFLINE": "0", "NO_PROXY": "127.0.0.1",
                "no_proxy": "127.0.0.1", "HF_HUB_DISABLE_TELEMETRY": "1"}

    def drive_folder(self, folder_id: str, title: str, files: dict[str, bytes]) -> None:
        """A Drive folder holding ``files`` (paths with ``/`` become sub-folders)."""
        children: list[str] = []
        self.drive_folders[folder_id] = (title, children)
        for path, data in files.items():
            parent, parts = children, path.split("/")
            for depth, part in enumerate(parts[:-1]):
                sub = ("f" * 20 + hashlib.sha1(("/".join(parts[:depth + 1]) + folder_id).encode()).hexdigest())[:33]
                if sub not in self.drive_folders:
                    self.drive_folders[sub] = (part, [])
                    parent.append(sub)
                parent = self.drive_folders[sub][1]
            file_id = ("d" * 20 + hashlib.sha1((path + folder_id).encode()).hexdigest())[:33]
            self.drive_files[file_id] = (parts[-1], data)
            parent.append(file_id)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handler(self):
        hosts = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self.answer(head=True)

            def do_GET(self):
                self.answer(head=False)

            def do_POST(self):
                url = urlparse(self.path)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                hosts.requests.append(("POST", url.path, None))
                service = url.path.rsplit("/", 2)[-2:]
                if service == ["competitions.CompetitionApiService", "DownloadDataFile"]:
                    item, name = f"competitions/{body.get('competitionName')}", body.get("fileName")
                elif service == ["datasets.DatasetApiService", "DownloadDataset"]:
                    item = f"datasets/{body.get('ownerSlug')}/{body.get('datasetSlug')}"
                    name = body.get("fileName") or f"{body.get('datasetSlug')}.zip"
                else:
                    return self.send(404, b"{}", {}, False)
                if not self.logged_in(hosts.kaggle_login):
                    return self.kaggle_error(401, "Unauthenticated")
                if item in hosts.kaggle_refused:
                    return self.kaggle_error(403, "You must accept this competition's rules before you'll be able to "
                                                  "download files.")
                if name not in hosts.kaggle.get(item, {}):
                    return self.kaggle_error(404, "Not found")
                self.send(302, b"", {"Location": f"{hosts.url}/kaggle-files/{item}/{name}"}, False)

            def kaggle_error(self, status: int, message: str):
                body = json.dumps({"code": status, "message": message}).encode()
                self.send(status, body, {"Content-Type": "application/json"}, False)

            def logged_in(self, login: tuple[str, str]) -> bool:
                import base64

                expected = "Basic " + base64.b64encode(":".join(login).encode()).decode()
                return self.headers.get("Authorization") == expected

            def answer(self, head: bool):
                url = urlparse(self.path)
                hosts.requests.append((self.command, url.path, self.headers.get("Range")))
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                route, _, rest = url.path.lstrip("/").partition("/")
                if route == "hub":
                    self.hub(unquote(rest), head)
                elif route == "drive" and rest == "embeddedfolderview" and query.get("id") in hosts.drive_folders:
                    title, children = hosts.drive_folders[query["id"]]
                    links = "".join(
                        f'<a href="https://drive.google.com/drive/folders/{c}">{hosts.drive_folders[c][0]}</a>'
                        if c in hosts.drive_folders else
                        f'<a href="https://drive.google.com/file/d/{c}/view?usp=drive_web">{hosts.drive_files[c][0]}</a>'
                        for c in children)
                    self.send(200, f"<html><head><title>{title}</title></head><body>{links}</body></html>".encode(),
                              {"Content-Type": "text/html"}, head)
                elif route == "drive" and rest == "uc" and query.get("id") in hosts.drive_files:
                    self.file(hosts.drive_files[query["id"]][1], url.path, head, {})
                elif route == "raw" and unquote(rest) in hosts.raw:
                    self.file(hosts.raw[unquote(rest)], url.path, head, {})
                elif route == "github-api" and rest.startswith("repos/") and "/git/trees/" in rest:
                    repo, _, commit = rest[len("repos/"):].partition("/git/trees/")
                    prefix = f"{repo}/{commit}/"
                    tree = [{"path": key[len(prefix):], "type": "blob"} for key in sorted(hosts.raw) if key.startswith(prefix)]
                    self.send(200, json.dumps({"sha": commit, "tree": tree, "truncated": False}).encode(),
                              {"Content-Type": "application/json"}, head)
                elif route == "kaggle-files":
                    item = unquote(rest)
                    owner = next((k for k in hosts.kaggle if item.startswith(k + "/")), None)
                    if owner is None or item[len(owner) + 1:] not in hosts.kaggle[owner]:
                        return self.send(404, b"not found", {}, head)
                    self.file(hosts.kaggle[owner][item[len(owner) + 1:]], url.path, head,
                              {"Last-Modified": "Mon, 01 Jan 2024 00:00:00 GMT"})
                elif route == "physionet":
                    item = unquote(rest)
                    if not self.logged_in(hosts.physionet_login):
                        return self.send(401, b"unauthorized", {"WWW-Authenticate": 'Basic realm="PhysioNet"'}, head)
                    if "/".join(item.split("/")[:2]) in hosts.physionet_refused:
                        return self.send(403, b"forbidden", {}, head)
                    if item not in hosts.physionet:
                        return self.send(404, b"not found", {}, head)
                    self.file(hosts.physionet[item], url.path, head, {})
                elif route == "plain" and unquote(rest) in hosts.plain:
                    self.file(hosts.plain[unquote(rest)], url.path, head, {})
                else:
                    self.send(404, b"not found", {}, head)

            def hub(self, rest: str, head: bool):
                if rest.startswith("api/models/"):
                    repo = "/".join(rest.split("/")[2:4])
                    if repo in hosts.gated:
                        return self.send(hosts.gated[repo], b"{}", {"X-Error-Code": "GatedRepo"}, head)
                    if repo not in hosts.hub:
                        return self.send(404, b"{}", {"X-Error-Code": "RepoNotFound"}, head)
                    body = {"id": repo, "modelId": repo, "sha": COMMIT,
                            "siblings": [{"rfilename": name} for name in hosts.hub[repo]]}
                    return self.send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
                parts = rest.split("/")
                repo, name = "/".join(parts[:2]), "/".join(parts[4:])
                if len(parts) < 5 or parts[2] != "resolve" or repo not in hosts.hub:
                    return self.send(404, b"", {"X-Error-Code": "RepoNotFound"}, head)
                if repo in hosts.gated:
                    return self.send(hosts.gated[repo], b"", {"X-Error-Code": "GatedRepo", "X-Repo-Commit": COMMIT}, head)
                if name not in hosts.hub[repo]:
                    return self.send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT}, head)
                self.file(hosts.hub[repo][name], f"/hub/{rest}", head, {"X-Repo-Commit": COMMIT})

            def file(self, data: bytes, path: str, head: bool, extra: dict):
                etag = '"' + hashlib.sha256(data).hexdigest() + '"'
                start = 0
                wanted = self.headers.get("Range")
                headers = {**extra, "ETag": etag, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
                if wanted and wanted.startswith("bytes=") and not head:
                    start = int(wanted[6:].split("-")[0])
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                body = data[start:]
                self.send_response(206 if start else 200)
                for key, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(key, value)
                self.end_headers()
                if head:
                    return
                half = max(1, len(data) // 2 - start)
                if path in hosts.stall and start == 0:
                    self.wfile.write(body[:half])
                    self.wfile.flush()
                    time.sleep(600)
                if path in hosts.drop and start == 0:
                    hosts.drop.discard(path)
                    self.wfile.write(body[:half])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(body)

            def send(self, status: int, body: bytes, headers: dict, head: bool):
                self.send_response(status)
                for key, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(key, value)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

        return Handler
