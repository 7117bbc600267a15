"""Released weights by name: where each registered model's files come from (``models/configs/weights.yaml``), one
cache, pulling them through the ecosystem's own clients and checking them against a lock file.

- The cache: ``--dir``, else ``$XBENCH_WEIGHTS_DIR``, else ``~/.cache/xbench_pl/weights``; a release lands in
  ``CACHE/<source>/`` in its own file layout.
- Hub releases go through huggingface_hub's client (its endpoint: ``$HF_ENDPOINT``), Google Drive files and
  GitHub files through ``gdown.download`` (hosts: ``$XBENCH_DRIVE_URL``, ``$XBENCH_GITHUB_RAW_URL``; tests point them at
  a loopback server). gdown lists a Drive folder only on Google's own host, so the folder listing (the
  ``embeddedfolderview`` page gdown reads too) is read here.
- A file is downloaded into ``CACHE/.partial/<source>/`` (both clients resume from their partial files there),
  its SHA-256 checked against the lock, then renamed into place: nothing half-written or unchecked ever has its
  final name. The first pull records each file's SHA-256 and size in ``CACHE/weights.lock.json`` (and a hub
  release's resolved commit, which later pulls then ask for); ``verify`` re-hashes. A file a pull finds already in
  place is recorded as ``"placed": "hand"``: what was found, unverified.
- A run by name checks the cached files it is about to load against the lock (``check_cached``); a hash is
  remembered with the file's size and ``mtime_ns``, so only a file touched since is hashed again.
- Only this module and ``commands/weights.py`` download; models still read local files only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote

import yaml

from xbench_pl.outputs import OutputError, atomic_write, check_writable

SOURCES_FILE = Path(__file__).resolve().parent / "models" / "configs" / "weights.yaml"
CACHE_ENV = "XBENCH_WEIGHTS_DIR"
DRIVE_ENV = "XBENCH_DRIVE_URL"
GITHUB_RAW_ENV = "XBENCH_GITHUB_RAW_URL"
DEFAULT_DRIVE = "https://drive.google.com"
DEFAULT_GITHUB_RAW = "https://raw.githubusercontent.com"
LOCK_FILE = "weights.lock.json"
PARTIAL = ".partial"
HUB = "hf-hub:"
#: the files of an ``hf-hub:ORG/NAME`` checkpoint: configs and tokenizers, then the first weights file present
HUB_SMALL_FILES = re.compile(r"[^/]*\.(json|txt|model)$")
HUB_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors", "open_clip_pytorch_model.bin",
               "model.safetensors", "pytorch_model.bin")
KINDS = ("hub", "drive_folder", "drive_file", "github")
PULL_COMMAND = "python -m xbench_pl weights pull"
#: a lock entry's ``placed`` for a file a pull found in the cache rather than downloaded: its hash is only what was found
HAND = "hand"
#: a file written this recently may be written again within its filesystem's clock tick (FAT's is 2 s) with its
#: mtime unchanged: its hash is remembered by (size, mtime_ns) only once it is older
SETTLED_NS = 2_000_000_000


class WeightsError(ValueError):
    """A pull or check that cannot go on; the message is one line naming the model, source or file, and the fix."""


@dataclass(frozen=True)
class Source:
    """One release: ``kind`` (``KINDS``), ``where`` (repository or Drive id), its files and what is published of it."""

    name: str
    kind: str
    where: str
    files: tuple[str, ...]
    revision: str | None = None
    licence: str = "not stated"
    size: str | None = None
    note: str | None = None
    shards: str | None = None  # an index file among ``files`` whose ``weight_map`` names the weight shards to pull too

    def describe(self) -> str:
        at = f"@{self.revision}" if self.revision else ""
        return f"{self.kind.replace('_', ' ')} {self.where}{at}"


@dataclass(frozen=True)
class Needs:
    """What a registered model reads: init argument -> ``SOURCE`` or ``SOURCE/FILE`` references; ``none``: why nothing
    can be pulled."""

    model: str
    arguments: dict[str, list[str]] = field(default_factory=dict)
    listed: frozenset[str] = frozenset()  # the arguments given as a list
    none: str | None = None


@lru_cache(maxsize=None)  # read once per process: the file ships with the package; callers only read the answer
def read_sources(path: Path = SOURCES_FILE) -> tuple[dict[str, Source], dict[str, Needs]]:
    data = yaml.safe_load(path.read_text())
    sources = {}
    for name, entry in data["sources"].items():
        kind = next(k for k in KINDS if k in entry)
        sources[name] = Source(name, kind, str(entry[kind]), tuple(entry["files"]), entry.get("revision"),
                               entry.get("licence", "not stated"), entry.get("size"), entry.get("note"), entry.get("shards"))
        if sources[name].shards is not None and sources[name].shards not in sources[name].files:
            raise ValueError(f"{path}: source {name!r}: its shards index {sources[name].shards!r} is not one of its files")
    needs = {}
    for model, entry in data["models"].items():
        entry = dict(entry or {})
        none = entry.pop("none", None)
        arguments = {arg: [refs] if isinstance(refs, str) else list(refs) for arg, refs in entry.items()}
        for ref in (r for refs in arguments.values() for r in refs):
            source, _, file = ref.partition("/")
            if source not in sources or (file and file not in sources[source].files):
                raise ValueError(f"{path}: model {model!r} names {ref!r}, which no source lists")
        needs[model] = Needs(model, arguments, frozenset(a for a, r in entry.items() if not isinstance(r, str)), none)
    return sources, needs


def cache_dir(override: str | Path | None = None) -> Path:
    return Path(override or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "xbench_pl" / "weights").expanduser()


def wanted_files(needs: Needs, sources: dict[str, Source], cache: Path | None = None) -> dict[str, list[str]]:
    """Source -> the files a model reads of it: the named file, or every file of a release it reads whole, and (with
    ``cache``) the weight shards its index names once the index is there (``shard_names``)."""
    wanted: dict[str, list[str]] = {}
    for ref in (r for refs in needs.arguments.values() for r in refs):
        source, _, file = ref.partition("/")
        names = [file] if file else list(sources[source].files)
        if not file and cache is not None and sources[source].shards:
            names += shard_names(cache / source / sources[source].shards)
        for name in names:
            wanted.setdefault(source, [])
            if name not in wanted[source]:
                wanted[source].append(name)
    return wanted


def shard_names(index: Path) -> list[str]:
    """The weight files a sharded release's index (``model.safetensors.index.json``: its ``weight_map``) names, sorted;
    none before the index is pulled."""
    if not index.is_file():
        return []
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise WeightsError(f"{index}: not a weights index with a weight_map ({error}); delete it and pull again") from None
    bad = [n for n in names if not isinstance(n, str) or "/" in n or n.startswith(".")]
    if bad:
        raise WeightsError(f"{index}: weight_map names {bad[0]!r}, not a file beside the index")
    return names


def cached_arguments(needs: Needs, cache: Path) -> tuple[dict[str, str], list[Path]]:
    """The command-line value of each of the model's arguments in ``cache`` (a list as JSON), and the files missing."""
    sources, _ = read_sources()
    missing = [cache / source / name for source, names in wanted_files(needs, sources, cache).items() for name in names
               if not (cache / source / name).is_file()]
    values = {}
    for arg, refs in needs.arguments.items():
        paths = [str(cache / ref) for ref in refs]
        values[arg] = json.dumps(paths) if arg in needs.listed else paths[0]
    return values, missing


# -- lock file ---------------------------------------------------------------------------------------------------
def read_lock(cache: Path) -> dict:
    path = cache / LOCK_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise WeightsError(f"lock file {path} is not readable JSON ({error}); move it aside and pull again") from error


def write_lock(cache: Path, lock: dict) -> None:
    atomic_write(cache / LOCK_FILE, json.dumps(lock, indent=1, sort_keys=True) + "\n")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def stamp(stat: os.stat_result) -> dict[str, int]:
    """The lock entry's ``mtime_ns`` by which a file's hash is remembered; none for a file too recently written."""
    return {"mtime_ns": stat.st_mtime_ns} if time.time_ns() - stat.st_mtime_ns > SETTLED_NS else {}


def change(path: Path, recorded: dict, rehash: bool = True) -> str | None:
    """How ``path`` differs from its lock entry ``recorded``, in words, or None. Without ``rehash``, the entry's hash is
    trusted while the file's size and mtime_ns are the ones remembered with it; a file hashed and found unchanged has
    them remembered in ``recorded`` (``remember`` writes them)."""
    stat = path.stat()
    if stat.st_size != recorded["size"]:
        return f"size {stat.st_size} bytes differs from the lock's {recorded['size']}"
    if not rehash and recorded.get("mtime_ns") == stat.st_mtime_ns:
        return None
    if (digest := sha256(path)) != recorded["sha256"]:
        return f"SHA-256 {digest} differs from the lock's {recorded['sha256']}"
    recorded.pop("mtime_ns", None)
    recorded.update(stamp(stat))
    return None


def since(recorded: dict) -> str:
    return "placed by hand" if recorded.get("placed") == HAND else "pulled"


def remember(cache: Path, checked: dict[tuple[str, str], dict]) -> None:
    """Write the stamps ``change`` gave the ``checked`` entries ((source, name) -> entry) into the lock as it is now
    (a pull may have written it meanwhile), where an entry's hash is still the one checked and its stamp is new."""
    lock, new = read_lock(cache), False
    for (source, name), recorded in checked.items():
        entry = lock.get(source, {}).get("files", {}).get(name)
        if entry is not None and entry["sha256"] == recorded["sha256"] and entry.get("mtime_ns") != recorded.get("mtime_ns"):
            entry.pop("mtime_ns", None)
            if "mtime_ns" in recorded:
                entry["mtime_ns"] = recorded["mtime_ns"]
            new = True
    if new:
        try:
            write_lock(cache, lock)
        except OSError:  # a cache shared read-only: its files are hashed again next time, nothing else is lost
            pass


def check_files(cache: Path, files: dict[str, list[str]], fix: str) -> list[Path]:
    """The cached files (source -> names; those present) a run is about to load, checked against the lock with
    ``change``'s remembered hashes: the first that changed since it was pulled or placed raises ``WeightsError``
    naming it, what changed and ``fix``. Returns those no pull downloaded (placed by hand, or not in the lock), which a
    run may load unverified."""
    lock = read_lock(cache)
    unverified, checked = [], {}
    try:
        for source, names in files.items():
            for name in names:
                path, recorded = cache / source / name, lock.get(source, {}).get("files", {}).get(name)
                if not path.is_file():
                    continue
                if recorded is None or recorded.get("placed") == HAND:
                    unverified.append(path)
                if recorded is None:
                    continue
                if (what := change(path, recorded, rehash=False)) is not None:
                    raise WeightsError(f"{path} changed since it was {since(recorded)} ({what}); {fix}")
                checked[(source, name)] = recorded
    finally:  # what was hashed is remembered even when a later file stops the run
        remember(cache, checked)
    return unverified


def check_cached(needs: Needs, cache: Path) -> str | None:
    """Before a run by name loads ``needs``' cached files: ``WeightsError`` (one line) for a file changed since it was
    pulled; the warning line naming the files no pull downloaded, or None."""
    sources, _ = read_sources()
    pull_again = f"`{PULL_COMMAND} {needs.model}`"
    try:
        unverified = check_files(cache, wanted_files(needs, sources, cache), f"delete it and run {pull_again} again")
    except WeightsError as error:
        raise WeightsError(f"--model {needs.model}: {error}") from None
    if not unverified:
        return None
    return (f"--model {needs.model}: unverified: {', '.join(str(p) for p in unverified)} placed in the weights cache by "
            f"hand, not downloaded by `weights pull` (to verify, delete and run {pull_again})")


def verify(cache: Path, models: list[str] | None = None) -> tuple[list[str], list[str], list[str]]:
    """Re-hash the locked files (of ``models``, else all): ``(pulled files that match, files placed by hand that are
    as found: unverified, problems)``, each problem one line naming the file."""
    sources, needs = read_sources()
    lock = read_lock(cache)
    selected = None if models is None else {
        (source, name) for m in models for source, names in wanted_files(needs[m], sources, cache).items() for name in names}
    good, unverified, problems, checked = [], [], [], {}
    for source, entry in sorted(lock.items()):
        for name, recorded in sorted(entry.get("files", {}).items()):
            if selected is not None and (source, name) not in selected:
                continue
            path = cache / source / name
            if not path.is_file():
                problems.append(f"{path}: missing (locked with SHA-256 {recorded['sha256']})")
            elif (what := change(path, recorded)) is not None:
                problems.append(f"{path}: {what} (changed since it was {since(recorded)}; delete it and pull again)")
            else:
                checked[(source, name)] = recorded
                (unverified if recorded.get("placed") == HAND else good).append(str(path))
    remember(cache, checked)
    if selected is not None:
        locked = {(s, n) for s, e in lock.items() for n in e.get("files", {})}
        problems += [f"{cache / s / n}: not pulled (no lock entry)" for s, n in sorted(selected - locked)]
    return good, unverified, problems


def lock_entry(lock: dict, cache: Path, path: Path) -> dict | None:
    """The lock's entry of the cached file ``path``, or None."""
    for source, entry in lock.items():
        if path.is_relative_to(cache / source):
            return entry.get("files", {}).get(path.relative_to(cache / source).as_posix())
    return None


# -- pulling -----------------------------------------------------------------------------------------------------
def check_cache(cache: Path) -> None:
    try:
        check_writable({f"weights cache (--dir or ${CACHE_ENV})": cache})
    except OutputError as error:
        raise WeightsError(str(error)) from error


def pull(model: str, cache: Path, quiet: bool = False) -> list[Path]:
    """Every file ``model`` reads, in the cache (downloaded, checked and placed where missing); their paths."""
    sources, needs = read_sources()
    if model not in needs:
        raise WeightsError(f"unknown model {model!r}; models: {', '.join(needs)}")
    if needs[model].none:
        raise WeightsError(f"{model}: {needs[model].none}")
    check_cache(cache)
    placed = []
    for source, names in wanted_files(needs[model], sources).items():
        placed += [pull_file(sources[source], name, cache, quiet) for name in names]
        shards = [n for n in wanted_files(needs[model], sources, cache).get(source, []) if n not in names]  # the index's
        placed += [pull_file(sources[source], name, cache, quiet) for name in shards]
        shutil.rmtree(cache / PARTIAL / source, ignore_errors=True)  # all placed: the clients' bookkeeping goes
    return placed


def pull_file(source: Source, name: str, cache: Path, quiet: bool) -> Path:
    final = cache / source.name / name
    lock = read_lock(cache)
    recorded = lock.get(source.name, {}).get("files", {}).get(name)
    if final.is_file():
        if recorded is None:  # placed by hand, or before the lock: record what was found, as unverified
            record(cache, source, name, final, None, by_hand=True)
        return final
    partial = cache / PARTIAL / source.name
    try:
        downloaded, commit = download(source, name, partial, lock.get(source.name, {}).get("revision"), quiet)
    except OSError as error:  # requests' connection errors are OSErrors too: those are the host's, not the disk's
        if (reason := unreachable(error)) is not None:
            raise cannot_reach(f"{source.name}: {name} from {source.describe()}", host_of(source), reason) from error
        raise WeightsError(f"{source.name}: cannot write {error.filename or partial}: {error.strerror or error}") from error
    digest = sha256(downloaded)
    if recorded is not None and digest != recorded["sha256"]:
        downloaded.unlink()
        raise WeightsError(f"{source.name}/{name} from {source.describe()}: SHA-256 {digest} differs from the lock's "
                           f"{recorded['sha256']}: the release changed since it was first pulled (nothing was placed; "
                           f"remove its entry from {cache / LOCK_FILE} to accept the new file)")
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(downloaded, final)
    record(cache, source, name, final, commit, digest)
    return final


#: what a failed connection's errno means, said plainly (``unreachable``)
CONNECTION_REASONS = {"Connection refused": "the connection was refused", "Name or service not known": "its name does not "
                      "resolve: no network, or no DNS", "Temporary failure in name resolution": "its name does not resolve: "
                      "no network, or no DNS", "Network is unreachable": "the network is unreachable",
                      "No route to host": "no route to the host", "timed out": "the connection timed out"}


def unreachable(error: BaseException) -> str | None:
    """Why a host could not be reached, in words, where ``error`` (or its cause) is a failed connection (requests',
    httpx's); None for any other error."""
    chain, seen = [], error
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    names = {type(e).__name__ for e in chain} | {c.__name__ for e in chain for c in type(e).__mro__}
    text = " ".join(str(e) for e in chain)
    connection = {"ConnectionError", "ConnectError", "ConnectTimeout", "NewConnectionError", "NameResolutionError"}
    if not names & connection and "Failed to establish a new connection" not in text:  # (gdown re-raises it as text)
        return None
    return next((said for raw, said in CONNECTION_REASONS.items() if raw in text), "the connection failed")


def cannot_reach(item: str, host: str, reason: str, setting: str = "") -> WeightsError:
    """The one line of a download whose host could not be reached (``unreachable``'s ``reason``)."""
    return WeightsError(f"{item}: cannot reach {host} ({reason}); check the network{setting} and pull again (a pull resumes)")


def host_of(source: Source) -> str:
    """The host a source is pulled from (the endpoints the environment may point elsewhere)."""
    return {"hub": hub_endpoint(), "github": os.environ.get(GITHUB_RAW_ENV, DEFAULT_GITHUB_RAW)}.get(source.kind, drive_base())


def record(cache: Path, source: Source, name: str, path: Path, commit: str | None, digest: str | None = None,
           by_hand: bool = False) -> None:
    lock = read_lock(cache)
    entry = lock.setdefault(source.name, {"from": source.describe(), "files": {}})
    if commit:
        entry["revision"] = commit
    stat = path.stat()  # before hashing here: a write meanwhile changes the mtime, so the hash is not remembered by it
    entry["files"][name] = {"sha256": digest or sha256(path), "size": stat.st_size, **stamp(stat),
                            **({"placed": HAND} if by_hand else {})}
    write_lock(cache, lock)


def download(source: Source, name: str, partial: Path, commit: str | None, quiet: bool) -> tuple[Path, str | None]:
    """``name`` of ``source`` downloaded whole under ``partial`` (resuming what an earlier try left there), and the
    hub commit it came from."""
    partial.mkdir(parents=True, exist_ok=True)
    if source.kind == "hub":
        return hub_download(source.where, name, commit or source.revision, partial, quiet, source.name)
    if source.kind == "drive_file":
        url = f"{drive_base()}/uc?id={source.where}"
    elif source.kind == "drive_folder":
        url = f"{drive_base()}/uc?id={drive_file_id(source, name)}"
    else:
        url = f"{os.environ.get(GITHUB_RAW_ENV, DEFAULT_GITHUB_RAW).rstrip('/')}/{source.where}/{source.revision}/{quote(name)}"
    return gdown_download(url, partial / name, source, name, quiet), None


def hub_download(repo: str, name: str, revision: str, folder: Path, quiet: bool, what: str) -> tuple[Path, str]:
    """One hub file through huggingface_hub's own metadata call and HTTP client (``get_hf_file_metadata``,
    ``http_get``: auth headers, redirects, retries, progress bar) into ``folder/NAME``, resuming a partial file an
    earlier process left (``hf_hub_download`` of huggingface_hub 2.4, its PR #4228, downloads each try into a process-unique
    temporary file that it deletes on failure, so a killed pull would start over)."""
    from urllib.parse import urlparse

    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import FileMetadataError, GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    endpoint = hub_endpoint()
    try:
        meta = get_hf_file_metadata(hf_hub_url(repo, name, revision=revision, endpoint=endpoint), endpoint=endpoint)
        if meta.commit_hash and meta.commit_hash != revision:  # the bytes of that commit, whatever the branch does next
            meta = get_hf_file_metadata(hf_hub_url(repo, name, revision=meta.commit_hash, endpoint=endpoint),
                                        endpoint=endpoint)
        # one partial file per served version (ETag): bytes of another version are never continued
        partial = folder / f"{name}.{hashlib.sha1((meta.etag or '').encode()).hexdigest()[:16]}.incomplete"
        partial.parent.mkdir(parents=True, exist_ok=True)
        if meta.size is not None and partial.is_file() and partial.stat().st_size > meta.size:
            partial.unlink()
        headers = build_hf_headers()
        if urlparse(meta.location).netloc != urlparse(endpoint).netloc:  # a CDN gets no token
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        with open(partial, "ab") as stream:
            http_get(meta.location, stream, resume_size=stream.tell(), headers=headers, expected_size=meta.size,
                     displayed_filename=name, tqdm_class=_silent() if quiet else None)
    except OfflineModeIsEnabled as error:
        raise WeightsError(f"{what}: HF_HUB_OFFLINE is set; unset it to pull {repo}") from error
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else None
        raise WeightsError(http_problem(status, what, f"{repo}@{revision}: {name}",
                                        f"https://huggingface.co/{repo}", isinstance(error, GatedRepoError))) from error
    except FileMetadataError as error:  # something answered, but not as a hub
        raise WeightsError(f"{what}: {repo}@{revision}: {name}: {endpoint} does not answer as a Hugging Face hub: "
                           f"{str(error).splitlines()[0]}") from error
    except Exception as error:  # the client's transport errors (connection refused, dropped and retried out)
        if type(error).__module__.split(".")[0] not in ("httpx", "httpx2", "httpcore", "httpcore2"):
            raise
        if (reason := unreachable(error)) is not None:
            raise cannot_reach(f"{what}: {repo}@{revision}: {name}", endpoint, reason, " (or HF_ENDPOINT)") from error
        raise WeightsError(f"{what}: {repo}@{revision}: {name}: {error}; pull again to resume") from error
    final = folder / name
    os.replace(partial, final)
    return final, meta.commit_hash


def hub_endpoint() -> str:
    """``$HF_ENDPOINT`` as it is now (huggingface_hub reads it once, when imported)."""
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


def _silent():
    """A tqdm class that shows nothing (``--quiet``)."""
    from tqdm.auto import tqdm

    class Silent(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "disable": True})

    return Silent


def http_problem(status: int | None, what: str, item: str, page: str, gated: bool = False) -> str:
    if gated or status in (401, 403):
        return (f"{what}: {item} is refused (HTTP {status}): its licence or access terms must be accepted first; open "
                f"{page} while logged in, accept them, then log in here (`hf auth login` or HF_TOKEN) and pull again")
    if status == 404:
        return f"{what}: {item} is gone (HTTP 404): the release moved or was withdrawn; see docs/weights.md"
    return f"{what}: {item} could not be downloaded (HTTP {status}); pull again later"


def drive_base() -> str:
    return os.environ.get(DRIVE_ENV, DEFAULT_DRIVE).rstrip("/")


def gdown_download(url: str, output: Path, source: Source, name: str, quiet: bool) -> Path:
    import gdown
    import requests
    from gdown.exceptions import FileURLRetrievalError

    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        gdown.download(url=url, output=str(output), quiet=quiet, resume=True, retries=3, use_cookies=False)
    except requests.HTTPError as error:
        status = error.response.status_code if error.response is not None else None
        raise WeightsError(http_problem(status, source.name, f"{name} from {source.describe()}", url)) from error
    except (FileURLRetrievalError, requests.RequestException) as error:
        if (reason := unreachable(error)) is not None:
            raise cannot_reach(f"{source.name}: {name} from {source.describe()}", host_of(source), reason) from error
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
        raise WeightsError(f"{source.name}: {name} from {source.describe()} could not be downloaded: {first}; "
                           "pull again to resume") from error
    except gdown.exceptions.DownloadError as error:
        if (reason := unreachable(error)) is not None:
            raise cannot_reach(f"{source.name}: {name} from {source.describe()}", host_of(source), reason) from error
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise WeightsError(f"{source.name}: {name} from {source.describe()}: {first}; pull again to resume") from error
    return output


def drive_listing(folder_id: str, prefix: str = "") -> dict[str, str]:
    """Path inside a Drive folder -> file id, sub-folders included (the page gdown's folder download reads)."""
    import bs4
    import requests

    response = requests.get(f"{drive_base()}/embeddedfolderview", params={"id": folder_id}, timeout=60)
    if response.status_code != 200:
        raise WeightsError(http_problem(response.status_code, "Drive folder", folder_id,
                                        f"https://drive.google.com/drive/folders/{folder_id}"))
    files = {}
    for link in bs4.BeautifulSoup(response.text, features="html.parser").find_all("a"):
        href, title = link.get("href", ""), link.get_text(strip=True)
        if found := re.match(r"https://drive\.google\.com/file/d/([-\w]{25,})/view", href):
            files[prefix + title] = found.group(1)
        elif found := re.match(r"https://drive\.google\.com/drive/(?:u/\d+/)?folders/([-\w]{25,})", href):
            files.update(drive_listing(found.group(1), f"{prefix}{title}/"))
    return files


def drive_file_id(source: Source, name: str) -> str:
    """The id of ``name`` in the Drive folder: its own path, else the one file whose path ends with it (or whose path
    ``name`` ends with: the shared folder may be the release's top folder itself)."""
    listing = drive_listing(source.where)
    if name in listing:
        return listing[name]
    matches = [path for path in listing if path.endswith("/" + name) or name.endswith("/" + path)]
    if len(matches) != 1:
        held = ", ".join(sorted(listing)[:8]) or "nothing"
        raise WeightsError(f"{source.name}: the Drive folder {source.where} holds {'no' if not matches else 'several'} "
                           f"{name} (it holds {held}); the release changed: see docs/weights.md")
    return listing[matches[0]]


# -- hf-hub:ORG/NAME checkpoints --------------------------------------------------------------------------------
def hub_folder(value: str, cache: Path | None = None, quiet: bool = False) -> Path:
    """``hf-hub:ORG/NAME[@REVISION]`` as a local folder, as open_clip reads it: the repository's configs and
    tokenizer files and its first weights file (``HUB_WEIGHTS``), downloaded once into ``CACHE/hf-hub/ORG/NAME``."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    repo, _, revision = value[len(HUB):].partition("@")
    if repo.count("/") != 1:
        raise WeightsError(f"{value!r}: expected hf-hub:ORG/NAME (optionally @REVISION)")
    cache = cache_dir(cache)
    key, folder = f"hf-hub/{repo}", cache / "hf-hub" / repo
    entry = read_lock(cache).get(key)
    if entry and (not revision or revision == entry.get("asked")) and all((folder / n).is_file() for n in entry["files"]):
        check_files(cache, {key: list(entry["files"])}, "delete it and run again to download it anew")
        return folder
    check_cache(cache)
    try:
        info = HfApi(endpoint=hub_endpoint()).model_info(repo, revision=revision or None)
    except OfflineModeIsEnabled as error:
        raise WeightsError(f"{value}: HF_HUB_OFFLINE is set; unset it to download {repo}") from error
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else None
        raise WeightsError(http_problem(status, value, repo, f"https://huggingface.co/{repo}")) from error
    names = [s.rfilename for s in info.siblings or []]
    weights = next((n for n in HUB_WEIGHTS if n in names), None)
    if weights is None:
        raise WeightsError(f"{value}: the repository holds none of {list(HUB_WEIGHTS)} (it holds {names[:10]})")
    source = Source(key, "hub", repo, tuple([n for n in names if HUB_SMALL_FILES.fullmatch(n)] + [weights]), info.sha)
    for name in source.files:
        pull_file(source, name, cache, quiet)
    lock = read_lock(cache)
    lock[key]["asked"] = revision
    write_lock(cache, lock)
    shutil.rmtree(cache / PARTIAL / key, ignore_errors=True)
    return folder
