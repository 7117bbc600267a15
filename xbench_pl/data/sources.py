"""Datasets by name: where each one comes from, the evaluation sets pinned here, and pulling and verifying a folder
(``sources.yaml`` beside this module; ``python -m xbench_pl data list|pull|verify``).

- **Evaluation sets.** Each dataset names the sets it can be evaluated on (``--data.split NAME``; without it, its
  ``default``): the reader's own split to read (``reads``) and, where the ids are public, a sorted list of image ids in
  ``eval_sets/`` (one a line), with its count, the paper's count and where the choice comes from. The SHA-256 of an
  id list (``ids_sha256``: the sorted ids, one a line, UTF-8) is recorded in ``metrics.json`` for every run, so two
  labs can see that they scored the same images; a shipped list's file is that text, so its hash is comparable.
- **Pulling.** ``pull`` downloads what the benchmark reads of a dataset into ``DATA_DIR/NAME`` (``--dir``, else
  ``$XBENCH_DATA_DIR``, else ``~/.cache/xbench_pl/data``), where ``--data NAME`` finds it without ``--data.root``.
  Plain and PhysioNet files go through ``requests`` (Range resume, retries), Kaggle files through the ``kaggle``
  client with the user's own token, GitHub folders are listed through its trees API. A file is downloaded under
  ``DATA_DIR/.partial/NAME/`` (outside the dataset's folder, so no reader ever sees half a file), checked against
  the lock and renamed into place; the first pull records each file's SHA-256 and size in ``ROOT/xbench_data.lock.json``.
  Credentials are read from the environment or the user's own files and never stored.
- **Verifying.** ``verify_lock`` re-hashes the locked files; ``data verify`` (``commands/data.py``) then reads the
  folder with the dataset's own reader against its set (``compare_ids``).

Hosts can be pointed elsewhere (the tests' loopback stand-ins): ``XBENCH_KAGGLE_URL``, ``XBENCH_PHYSIONET_URL``,
``XBENCH_GITHUB_RAW_URL``, ``XBENCH_GITHUB_API_URL``, and a ``url`` piece's own ``XBENCH_URL_<DATASET>``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import netrc
import os
import shutil
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from urllib.parse import quote, urlparse

import yaml

from xbench_pl.outputs import atomic_write
from xbench_pl.weights import sha256, unreachable

HERE = Path(__file__).resolve().parent
SOURCES_FILE = HERE / "sources.yaml"
EVAL_SETS = HERE / "eval_sets"
DATA_ENV = "XBENCH_DATA_DIR"
LOCK_FILE = "xbench_data.lock.json"
PARTIAL = ".partial"
PULL_COMMAND = "python -m xbench_pl data pull"
KINDS = ("kaggle_competition", "kaggle_dataset", "physionet", "url", "github", "manual")
HOSTS = {"physionet": ("XBENCH_PHYSIONET_URL", "https://physionet.org/files"),
         "github": ("XBENCH_GITHUB_RAW_URL", "https://raw.githubusercontent.com"),
         "github_api": ("XBENCH_GITHUB_API_URL", "https://api.github.com"),
         "kaggle": ("XBENCH_KAGGLE_URL", None)}
PHYSIONET_USER, PHYSIONET_PASSWORD = "PHYSIONET_USERNAME", "PHYSIONET_PASSWORD"
#: downloads retried in process after a dropped connection (each try resumes where the last one stopped)
RETRIES = 3
#: NIH ChestX-ray14's archive folders: images_001 holds the first 4,999 images in id order, each later one 10,000
NIH_FIRST_FOLDER, NIH_FOLDER = 4999, 10000


class DataSourceError(ValueError):
    """A pull or verification that cannot go on; the message is one line naming the dataset or file, and the fix."""


@dataclass(frozen=True)
class EvalSet:
    """One evaluation set of a dataset (``sources.yaml``: ``sets``)."""

    dataset: str
    name: str
    source: str
    count: int | None = None
    unit: str = "images"
    reads: str | None = None
    ids_file: str | None = None
    regions: int | None = None
    paper: int | None = None
    default: bool = False

    @property
    def restricts(self) -> bool:
        """Whether a run keeps only the pinned ids: a set other than the default, which is read whole (an official
        split or the labelled pool) and compared with its pinned ids."""
        return self.ids_file is not None and not self.default

    def ids(self) -> list[str] | None:
        """The pinned ids, sorted; None where the set is defined by its rule alone (ids behind an agreement)."""
        return None if self.ids_file is None else (EVAL_SETS / self.ids_file).read_text().split()

    def describe(self) -> str:
        count = f"{self.count:,} {self.unit}" if self.count is not None else "count not stated"
        pinned = f"ids pinned in {self.ids_file}" if self.ids_file else "no id list (ids behind the data's agreement)"
        paper = f"; the paper: {self.paper:,}" if self.paper is not None else ""
        return f"{self.name}: {count}, {pinned}{paper}; {self.source}"


@dataclass(frozen=True)
class Piece:
    """What one host gives of a dataset (``sources.yaml``: ``pull``)."""

    kind: str
    where: str
    files: tuple[str, ...] = ()
    each: dict | None = None
    whole: bool = False
    extract: bool = False
    revision: str | None = None
    folder: str = ""
    steps: str = ""

    def describe(self) -> str:
        at = f"@{self.revision[:12]}" if self.revision else ""
        return f"{self.kind.replace('_', ' ')} {self.where}{at}"


@dataclass(frozen=True)
class DatasetSource:
    name: str
    title: str
    host: str
    terms: str
    first: str
    size: str
    layout: str
    default: str
    sets: dict[str, EvalSet]
    pieces: tuple[Piece, ...]
    unverified: str | None = None


@lru_cache(maxsize=None)  # the file ships with the package: read once per process
def read_sources(path: Path = SOURCES_FILE) -> dict[str, DatasetSource]:
    datasets = {}
    for name, entry in yaml.safe_load(path.read_text())["datasets"].items():
        sets = {set_name: EvalSet(name, set_name, str(s["source"]), s.get("count"), s.get("unit", "images"), s.get("reads"),
                                  s.get("ids"), s.get("regions"), s.get("paper"), set_name == entry["default"])
                for set_name, s in entry["sets"].items()}
        if entry["default"] not in sets:
            raise ValueError(f"{path}: {name}: default set {entry['default']!r} is not one of its sets")
        pieces = []
        for piece in entry["pull"]:
            kind = next(k for k in KINDS if k in piece)
            files = piece.get("files", [])
            pieces.append(Piece(kind, str(piece[kind]), tuple(files), piece.get("each"), bool(piece.get("whole")),
                                bool(piece.get("extract")), piece.get("revision"), piece.get("folder", ""),
                                " ".join(str(piece.get("steps", "")).split())))
        datasets[name] = DatasetSource(name, entry["title"], entry["host"], " ".join(entry["terms"].split()),
                                       " ".join(entry["first"].split()), entry["size"], entry["layout"], entry["default"],
                                       sets, tuple(pieces), entry.get("_unverified"))
    return datasets


def eval_set(dataset: str, name: str | None) -> EvalSet | None:
    """The evaluation set ``name`` of ``dataset`` (its default for None); None for a dataset with no sources (the
    synthetic ones), which takes no set name."""
    source = read_sources().get(dataset)
    if source is None:
        if name is not None:
            raise ValueError(f"{dataset} has no evaluation sets (split): it is generated, not downloaded")
        return None
    if name is None:
        return source.sets[source.default]
    if name not in source.sets:
        raise ValueError(f"{dataset}: unknown split {name!r}; its evaluation sets: {', '.join(source.sets)} "
                         f"(`python -m xbench_pl data list` describes them)")
    return source.sets[name]


def ids_sha256(ids) -> str:
    """The SHA-256 of an id list: the sorted distinct ids, one a line, UTF-8 (the text of a shipped list's file)."""
    return hashlib.sha256("".join(f"{i}\n" for i in sorted(set(ids))).encode()).hexdigest()


def data_dir(override: str | Path | None = None) -> Path:
    return Path(override or os.environ.get(DATA_ENV) or Path.home() / ".cache" / "xbench_pl" / "data").expanduser()


def default_root(dataset: str) -> Path | None:
    """Where ``data pull`` puts ``dataset`` (``DATA_DIR/NAME``), when it is there and the dataset is pulled by name."""
    folder = data_dir() / dataset
    return folder if dataset in read_sources() and folder.is_dir() else None


def root_problem(dataset: str, root: Path | None, layout: str) -> str | None:
    """What is wrong with ``root`` as the folder of ``dataset``, which holds ``layout`` (``--data.root``'s line;
    ``test`` says it before Lightning loads, ``commands.early``), or None."""
    if root is None:
        pull = f" (or `{PULL_COMMAND} {dataset}` fills {data_dir() / dataset})" if dataset in read_sources() else ""
        return f"{dataset} root not set: give the folder holding {layout}{pull}"
    if not root.is_dir():
        return f"{root}: no such folder (give {dataset}'s folder, holding {layout})"
    return None


# -- lock ----------------------------------------------------------------------------------------------------------
def read_lock(root: Path) -> dict:
    path = root / LOCK_FILE
    if not path.is_file():
        return {"files": {}}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise DataSourceError(f"{path}: not readable JSON ({error}); move it aside and pull again") from error


def write_lock(root: Path, lock: dict) -> None:
    try:
        atomic_write(root / LOCK_FILE, json.dumps(lock, indent=1, sort_keys=True) + "\n")
    except OSError as error:
        raise DataSourceError(f"cannot write {root / LOCK_FILE}: {error.strerror or error}; make room and pull again "
                              "(the file it was to lock is not placed)") from error


# -- pulling -------------------------------------------------------------------------------------------------------
@dataclass
class Pull:
    """One dataset's pull into ``root``: the lock it keeps and what it placed."""

    source: DatasetSource
    root: Path
    partial: Path
    chosen: EvalSet
    quiet: bool
    lock: dict = field(default_factory=dict)
    placed: int = 0
    by_hand: list[str] = field(default_factory=list)

    def fill(self, pattern: str, **values) -> str:
        return pattern.format(split=self.chosen.reads or "", **values)


def pull(dataset: str, folder: Path, split: str | None = None, quiet: bool = False) -> Pull:
    """Every file ``dataset``'s evaluation set ``split`` reads, in ``folder/NAME`` (downloaded, checked against the
    lock and placed where missing)."""
    sources = read_sources()
    if dataset not in sources:
        raise DataSourceError(f"unknown dataset {dataset!r}; datasets pulled by name: {', '.join(sources)}")
    source = sources[dataset]
    chosen = eval_set(dataset, split)
    manual = [p for p in source.pieces if p.kind == "manual"]
    if manual:
        raise DataSourceError(f"{dataset}: {source.host} has no programmatic download; {manual[0].steps} "
                              f"(page: {manual[0].where})".replace("ROOT", str(folder / dataset)))
    root = folder / dataset
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataSourceError(f"cannot create {root}: {error.strerror or error}; choose another --dir") from error
    job = Pull(source, root, folder / PARTIAL / dataset, chosen, quiet, read_lock(root))
    for piece in source.pieces:
        for remote in piece.files:
            fetch(job, piece, job.fill(remote), job.fill(remote))
        if piece.whole:
            fetch(job, piece, "", f"{piece.where.rsplit('/', 1)[-1]}.zip")
        if piece.each:
            items = each_files(job, piece)
            for remote, local in progress(items, f"{dataset}: {len(items)} files", quiet):
                fetch(job, piece, remote, local, bar=False)
    shutil.rmtree(job.partial, ignore_errors=True)  # all placed: the partial files' bookkeeping goes
    return job


def progress(items: list, what: str, quiet: bool):
    if quiet:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=what, unit="file")


def each_files(job: Pull, piece: Piece) -> list[tuple[str, str]]:
    """``(remote, local)`` of every per-id file of ``piece``: ids from the set's list, else from a pulled table's
    column or a listing of the host's folder, restricted to the set's ids where it pins them."""
    each = piece.each
    if "table" in each:
        table = job.root / job.fill(each["table"])
        values = table_column(table, each["column"])
    else:
        values = [name[: -len(each["suffix"])] for name in github_listing(piece, each["listing"])
                  if name.endswith(each["suffix"])]
    pinned = job.chosen.ids()
    if pinned is not None:
        wanted = set(pinned)  # once: RSNA's table has 30,227 rows
        values = [v for v in values if v in wanted]
    files = [each["file"]] if isinstance(each["file"], str) else list(each["file"])
    nih = nih_folders(job.root) if any("{nih_folder}" in f for f in files) else {}
    pairs = []
    for value in dict.fromkeys(values):
        for pattern in files:
            remote = job.fill(pattern, id=value, value=value, nih_folder=nih.get(value, ""))
            local = job.fill(each.get("to", pattern), id=value, value=value, nih_folder=nih.get(value, ""))
            pairs.append((remote, local))
    return pairs


def table_column(path: Path, column: str) -> list[str]:
    """The values of ``column`` of a pulled csv, in order (pandas reads the csv: quoting, a leading space in a
    header such as SIIM's is stripped)."""
    import pandas as pd

    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError) as error:
        raise DataSourceError(f"{path}: cannot read it ({error}); delete it and pull again") from error
    frame.columns = [str(c).strip() for c in frame.columns]
    if column not in frame.columns:
        raise DataSourceError(f"{path}: no column {column!r} (it has {list(frame.columns)}); the release changed: "
                              "see docs/datasets.md")
    return [v.strip() for v in frame[column] if v.strip()]


def nih_folders(root: Path) -> dict[str, str]:
    """NIH image id -> its archive folder (``images_001`` ...), from its position in ``Data_Entry_2017.csv``."""
    ids = sorted(table_column(root / "Data_Entry_2017.csv", "Image Index"))
    return {image_id: f"images_{1 if i < NIH_FIRST_FOLDER else 2 + (i - NIH_FIRST_FOLDER) // NIH_FOLDER:03d}"
            for i, image_id in enumerate(ids)}


def fetch(job: Pull, piece: Piece, remote: str, local: str, bar: bool = True) -> None:
    """``remote`` of ``piece`` as ``job.root/local``: kept when there (a file there without a lock entry is recorded as
    placed by hand), else downloaded under the partial folder, its SHA-256 checked against the lock, and renamed into
    place (an archive is unpacked into the root instead)."""
    final = job.root / local
    recorded = job.lock["files"].get(local)
    if final.is_file() or (recorded and recorded.get("extracted")):
        if recorded is None:
            job.lock["files"][local] = {"sha256": sha256(final), "size": final.stat().st_size, "placed": "by hand"}
            job.by_hand.append(local)
            write_lock(job.root, job.lock)
        return
    partial = job.partial / f"{local}.incomplete"
    try:
        partial.parent.mkdir(parents=True, exist_ok=True)
        downloaded = download(job, piece, remote, partial, bar and not job.quiet)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise DataSourceError(f"{job.source.name}: cannot write {partial}: no space left on the device; make room "
                                  f"(or choose another --dir) and pull again: it resumes") from error
        raise DataSourceError(f"{job.source.name}: cannot write {error.filename or partial}: "
                              f"{error.strerror or error}") from error
    digest = sha256(downloaded)
    if recorded is not None and digest != recorded["sha256"]:
        downloaded.unlink()
        raise DataSourceError(f"{job.source.name}: {local} from {piece.describe()}: SHA-256 {digest} differs from the "
                              f"lock's {recorded['sha256']}: the file changed on the host since it was first pulled "
                              f"(nothing was placed; remove its entry from {job.root / LOCK_FILE} to accept it)")
    entry = {"sha256": digest, "size": downloaded.stat().st_size, "from": piece.describe()}
    archive = piece.whole or (piece.extract and local.endswith(".zip"))
    if archive:
        unpack(downloaded, job.root, job.source.name)
        entry["extracted"] = True
    job.lock["files"][local] = entry
    write_lock(job.root, job.lock)  # locked before it is placed: a file in place is never taken for one placed by hand
    if archive:
        downloaded.unlink()
    else:
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(downloaded, final)
    job.placed += 1


def unpack(archive: Path, root: Path, dataset: str) -> None:
    """An archive's members into ``root``, each written whole under a temporary name first (``atomic_write`` per
    member would hold it in memory: members are streamed)."""
    try:
        with zipfile.ZipFile(archive) as bundle:
            for member in bundle.infolist():
                target = (root / member.filename).resolve()
                if not target.is_relative_to(root.resolve()):
                    raise DataSourceError(f"{dataset}: {archive.name} holds {member.filename!r}, outside the folder")
                if member.is_dir():
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                temporary = target.with_name(f".{target.name}.incomplete")
                with bundle.open(member) as stream, open(temporary, "wb") as out:
                    shutil.copyfileobj(stream, out, 1 << 20)
                os.replace(temporary, target)
    except zipfile.BadZipFile as error:
        archive.unlink()
        raise DataSourceError(f"{dataset}: {archive.name} is not a zip archive ({error}); pull again") from error


def download(job: Pull, piece: Piece, remote: str, partial: Path, bar: bool) -> Path:
    if piece.kind.startswith("kaggle"):
        return kaggle_download(job, piece, remote, partial, bar)
    if piece.kind == "physionet":
        url = f"{host('physionet')}/{piece.where}/{quote(remote)}"
        return http_download(job, url, partial, bar, physionet_auth(job.source.name, url))
    if piece.kind == "github":
        path = "/".join(p for p in (piece.folder, remote) if p)
        return http_download(job, f"{host('github')}/{piece.where}/{piece.revision}/{quote(path)}", partial, bar)
    base = os.environ.get(f"XBENCH_URL_{job.source.name.upper()}", piece.where)
    return http_download(job, f"{base.rstrip('/')}/{quote(remote)}", partial, bar)


def host(kind: str) -> str:
    variable, default = HOSTS[kind]
    return os.environ.get(variable, default or "").rstrip("/")


def http_download(job: Pull, url: str, partial: Path, bar: bool, auth=None) -> Path:
    """``url`` into ``partial``, resuming the bytes an earlier try left there (``Range``), retrying a dropped
    connection ``RETRIES`` times; the complete file's path."""
    import requests

    for attempt in range(RETRIES + 1):
        have = partial.stat().st_size if partial.is_file() else 0
        try:
            with requests.get(url, headers={"Range": f"bytes={have}-"} if have else {}, auth=auth, stream=True,
                              timeout=60) as response:
                if response.status_code == 416:  # more bytes here than the host has: not its file, start over
                    partial.unlink()
                    continue
                if response.status_code >= 400:
                    raise DataSourceError(http_problem(job, response.status_code, url))
                resumed = response.status_code == 206
                total = int(response.headers.get("Content-Length", 0)) + (have if resumed else 0)
                with open(partial, "ab" if resumed else "wb") as out, byte_bar(bar, total, have if resumed else 0,
                                                                                partial.name) as shown:
                    for block in response.iter_content(1 << 16):  # small blocks: a dropped connection loses little
                        out.write(block)
                        shown.update(len(block))
                if total and partial.stat().st_size < total:
                    raise requests.ConnectionError(f"connection closed at {partial.stat().st_size} of {total} bytes")
                return partial
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as error:
            reason = unreachable(error)
            if attempt == RETRIES or (reason is not None and "closed" not in str(error)):
                what = f"cannot reach {urlparse(url).netloc} ({reason})" if reason else f"the download failed ({error})"
                raise DataSourceError(f"{job.source.name}: {url}: {what}; check the network and pull again "
                                      "(it resumes)") from error
    return partial


def byte_bar(shown: bool, total: int, initial: int, name: str):
    from tqdm.auto import tqdm

    return tqdm(total=total or None, initial=initial, unit="B", unit_scale=True, desc=name.removesuffix(".incomplete"),
                disable=not shown)


def http_problem(job: Pull, status: int, url: str) -> str:
    name, first = job.source.name, job.source.first
    if status == 401:
        return (f"{name}: {url} refused the credentials (HTTP 401): check {PHYSIONET_USER} and {PHYSIONET_PASSWORD} "
                f"or ~/.netrc, then pull again")
    if status == 403:
        return f"{name}: {url} is refused (HTTP 403): the data's terms must be accepted first: {first}; then pull again"
    if status == 404:
        return f"{name}: {url} is gone (HTTP 404): the release moved; see docs/datasets.md"
    return f"{name}: {url} could not be downloaded (HTTP {status}); pull again later (it resumes)"


def physionet_auth(dataset: str, url: str) -> tuple[str, str]:
    """The user's PhysioNet credentials: ``PHYSIONET_USERNAME``/``PHYSIONET_PASSWORD``, else ``~/.netrc``'s entry
    for the host; read for this request only, never stored."""
    user, password = os.environ.get(PHYSIONET_USER), os.environ.get(PHYSIONET_PASSWORD)
    if user and password:
        return user, password
    machine = urlparse(url).hostname
    try:
        entry = netrc.netrc().authenticators(machine)
    except (FileNotFoundError, netrc.NetrcParseError):
        entry = None
    if entry is None:
        raise DataSourceError(f"{dataset}: PhysioNet needs your credentials: set {PHYSIONET_USER} and "
                              f"{PHYSIONET_PASSWORD}, or add `machine {machine} login USER password PASSWORD` to "
                              "~/.netrc (a credentialed account that signed the data use agreement); nothing is stored")
    return entry[0], entry[2]


def github_listing(piece: Piece, folder: str) -> list[str]:
    """The file names in ``folder`` of a GitHub repository at the piece's revision (the git trees API)."""
    import requests

    prefix = "/".join(p for p in (piece.folder, folder) if p) + "/"
    url = f"{host('github_api')}/repos/{piece.where}/git/trees/{piece.revision}"
    try:
        response = requests.get(url, params={"recursive": "1"}, timeout=60)
    except requests.RequestException as error:
        raise DataSourceError(f"{piece.where}: cannot list {prefix} ({unreachable(error) or error}); check the "
                              "network and pull again") from error
    if response.status_code != 200:
        raise DataSourceError(f"{piece.where}: listing {prefix} failed (HTTP {response.status_code}) at {url}")
    return sorted(item["path"][len(prefix):] for item in response.json().get("tree", [])
                  if item.get("type") == "blob" and item["path"].startswith(prefix) and "/" not in item["path"][len(prefix):])


def kaggle_download(job: Pull, piece: Piece, remote: str, partial: Path, bar: bool) -> Path:
    """One file (or with ``remote`` empty, the dataset's whole archive) through the ``kaggle`` client, which resumes
    its own partial file; the downloaded file, moved to ``partial``."""
    import requests

    name = job.source.name
    check_kaggle_credentials(name)
    api = kaggle_api()
    folder = partial.parent / f".kaggle-{partial.name}"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        if piece.kind == "kaggle_competition":
            api.competition_download_file(piece.where, remote, path=str(folder), quiet=not bar, unzip=True)
        elif remote:
            api.dataset_download_file(piece.where, remote, path=str(folder), quiet=not bar, unzip=True)
        else:
            api.dataset_download_files(piece.where, path=str(folder), quiet=not bar)
    except requests.HTTPError as error:
        status = error.response.status_code if error.response is not None else None
        page = (f"https://www.kaggle.com/competitions/{piece.where}/rules" if piece.kind == "kaggle_competition"
                else f"https://www.kaggle.com/datasets/{piece.where}")
        if status == 403:
            raise DataSourceError(f"{name}: Kaggle refused {remote or piece.where} (HTTP 403): accept the terms first at "
                                  f"{page} while logged in, then pull again") from error
        if status == 401:
            raise DataSourceError(f"{name}: Kaggle refused the token (HTTP 401): create a new one at "
                                  "https://www.kaggle.com/settings and save it as ~/.kaggle/kaggle.json") from error
        raise DataSourceError(f"{name}: Kaggle: {piece.where}: {remote} could not be downloaded (HTTP {status}"
                              f"{', gone' if status == 404 else ''}); see docs/datasets.md") from error
    except (requests.ConnectionError, requests.Timeout) as error:
        raise DataSourceError(f"{name}: cannot reach Kaggle ({unreachable(error) or error}); check the network and "
                              "pull again (it resumes)") from error
    got = folder / (remote or f"{piece.where.rsplit('/', 1)[-1]}.zip")
    if not got.is_file():
        raise DataSourceError(f"{name}: the kaggle client left no {got.name} in {folder}")
    os.replace(got, partial)
    shutil.rmtree(folder, ignore_errors=True)
    return partial


def check_kaggle_credentials(dataset: str) -> None:
    """The token the ``kaggle`` client will use is there (else it prints its own help and exits the process)."""
    config = Path(os.environ.get("KAGGLE_CONFIG_DIR") or Path.home() / ".kaggle")
    if (os.environ.get("KAGGLE_API_TOKEN") or (os.environ.get("KAGGLE_USERNAME") and os.environ.get("KAGGLE_KEY"))
            or (config / "kaggle.json").is_file() or (config / "access_token").is_file()):
        return
    raise DataSourceError(f"{dataset}: Kaggle needs your API token: create one at https://www.kaggle.com/settings "
                          f"(API, Create New Token) and save it as {config / 'kaggle.json'}, or set KAGGLE_USERNAME "
                          "and KAGGLE_KEY; nothing is stored by xbench_pl")


def kaggle_api():
    """An authenticated ``KaggleApi``; ``XBENCH_KAGGLE_URL`` points its client at another host (the tests' stand-in:
    the client has no endpoint setting of its own, only its environment table, which this replaces)."""
    from kaggle.api.kaggle_api_extended import KaggleApi

    if host("kaggle"):
        from kagglesdk import kaggle_env

        kaggle_env._env_to_endpoint[kaggle_env.KaggleEnv.PROD] = host("kaggle")
    api = KaggleApi()
    api.authenticate()
    return api


# -- verifying -----------------------------------------------------------------------------------------------------
def verify_lock(root: Path) -> tuple[list[str], list[str], list[str]]:
    """Re-hash the files the lock lists: ``(files that match, files placed by hand, problems)``."""
    good, by_hand, problems = [], [], []
    for local, recorded in sorted(read_lock(root)["files"].items()):
        if recorded.get("extracted"):
            continue
        path = root / local
        if not path.is_file():
            problems.append(f"{path}: missing (pulled with SHA-256 {recorded['sha256']})")
        elif (digest := sha256(path)) != recorded["sha256"]:
            problems.append(f"{path}: changed since it was pulled (SHA-256 {digest}, the lock's {recorded['sha256']}); "
                            "delete it and pull again")
        else:
            (by_hand if recorded.get("placed") else good).append(str(path))
    return good, by_hand, problems


def compare_ids(chosen: EvalSet, ids: list[str]) -> dict:
    """What ``metrics.json`` records of an evaluated id list against its pinned set: ``split``, the count and SHA-256
    of the ids, and the pinned set's, with whether they match (None where the set pins no ids)."""
    pinned = chosen.ids()
    identity = {"split": chosen.name, chosen.unit: len(set(ids)), "ids_sha256": ids_sha256(ids)}
    if pinned is None:
        identity["pinned"] = {"ids": None, "count": chosen.count}
    else:
        here = set(ids) & set(pinned)
        identity["pinned"] = {"ids": chosen.ids_file, "count": len(pinned), "sha256": ids_sha256(pinned),
                              "present": len(here), "matches": identity["ids_sha256"] == ids_sha256(pinned)}
    return identity


def identity_line(dataset: str, identity: dict) -> str:
    """One line saying which images a run evaluates against its set (``compare_ids``)."""
    pinned, unit = identity["pinned"], next(k for k in identity if k not in ("split", "ids_sha256", "pinned"))
    head = f"{dataset}: split {identity['split']}, {identity[unit]:,} {unit}, ids SHA-256 {identity['ids_sha256'][:12]}"
    if pinned["ids"] is None:
        stated = f"; {pinned['count']:,} expected" if pinned["count"] is not None else ""
        return f"{head} (no id list ships for this set{stated})"
    if pinned["matches"]:
        return f"{head} (= the pinned {pinned['ids']})"
    return (f"{head} (differs from the pinned {pinned['ids']}: {pinned['present']:,} of its {pinned['count']:,} here; "
            f"`python -m xbench_pl data verify {dataset}` lists the differences)")
