"""Dumps in object storage: ``s3://``, ``gs://``, ``hdfs://`` URLs (and any scheme fsspec knows) through pyarrow.

pyarrow's filesystems do the work: credentials, region and endpoint come from the standard AWS environment and
config (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``~/.aws/config``; GCS and HDFS likewise from theirs), with nothing
rcdiag-specific. A scheme pyarrow has no filesystem for is handed to fsspec when fsspec knows it. Files are opened
as pyarrow random-access files, so a reader fetches the byte ranges it needs (a Parquet footer, then row groups
column by column); no object is downloaded whole before it is read. Every failure (a missing bucket, key or
permission) is one ``InputError`` naming the URL.

S3 and GCS are opened with bounded timeouts (``TIMEOUTS``, overridable through environment variables): without
them an unreachable service or a credential lookup that never answers would retry for many minutes in silence.
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlsplit

from rcdiag.runtime.environment import Variable, positive_seconds
from rcdiag.runtime.errors import InputError

SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
READ_BUFFER = 8 << 20
"""Reads from object storage go through a buffer of this size (per column stream of a Parquet file; JSONL and
Arrow IPC streams): every request pays a round trip, so fewer, larger ranges (local files use 1 MiB)."""


BUCKET_SCHEMES = frozenset({"s3", "gs", "gcs"})
"""Schemes whose URL's host part is a bucket (so it cannot be empty)."""


@dataclass(frozen=True)
class Timeout:
    """One bound on object-storage calls: the environment variable that overrides it and its default (seconds)."""

    env: str
    default: float
    meaning: str

    def seconds(self) -> float:
        """The bound in force: the variable's value when set (a positive number), else the default."""
        return Variable(self.env, "a positive number of seconds", positive_seconds).value(self.default)


CONNECT_TIMEOUT = Timeout("RCDIAG_STORAGE_CONNECT_TIMEOUT", 10.0, "S3: seconds to open a connection")
REQUEST_TIMEOUT = Timeout("RCDIAG_STORAGE_REQUEST_TIMEOUT", 60.0, "S3: seconds one request may take")
RETRY_LIMIT = Timeout(
    "RCDIAG_STORAGE_RETRY_LIMIT",
    10.0,
    "GCS: seconds to retry an unreachable service or a failed credential lookup before giving up",
)
TIMEOUTS = (CONNECT_TIMEOUT, REQUEST_TIMEOUT, RETRY_LIMIT)
"""The bounds on remote reads (docs/storage.md lists them)."""


def scheme_of(text: str) -> str | None:
    """The URL scheme of ``text`` (lower case), or ``None`` for a plain path."""
    match = SCHEME.match(text)
    return match.group(1).lower() if match else None


def is_remote(text: str) -> bool:
    """A URL read through a filesystem other than the local disk (``file://`` URLs are local paths)."""
    scheme = scheme_of(text)
    return scheme is not None and scheme != "file"


def local_path(text: str) -> str:
    """``file:///data/x.parquet`` -> ``/data/x.parquet``; a plain path is returned as it is."""
    if scheme_of(text) != "file":
        return text
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost"):
        raise InputError(f"names host '{parts.netloc}'; a file:// URL reads the local disk only", path=text)
    return unquote(parts.path) or "/"


@dataclass(frozen=True)
class RemotePath:
    """A file or prefix in object storage: the URL's ``root`` (``s3://``, ``hdfs://host:8020``) and the
    filesystem's path below it (``bucket/key`` for S3 and GCS). Offers the few ``pathlib`` properties the format
    registry uses (``name``, ``suffix``, ``stem``, ``parent``, ``parts``)."""

    root: str
    key: str

    def __str__(self) -> str:
        return self.root + self.key

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(p for p in self.key.split("/") if p)

    @property
    def name(self) -> str:
        return self.parts[-1] if self.parts else ""

    @property
    def suffix(self) -> str:
        name = self.name
        dot = name.rfind(".")
        return name[dot:] if 0 < dot < len(name) - 1 else ""

    @property
    def stem(self) -> str:
        return self.name[: len(self.name) - len(self.suffix)]

    @property
    def parent(self) -> RemotePath:
        return RemotePath(self.root, self.key.rstrip("/").rpartition("/")[0])

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(self.root, f"{self.key.rstrip('/')}/{name}")

    def with_suffix(self, suffix: str) -> RemotePath:
        return RemotePath(self.root, self.key[: len(self.key) - len(self.suffix)] + suffix)


def parse(url: str) -> RemotePath:
    """Split a URL into what precedes the filesystem's path (``s3://``, ``hdfs://host:8020``) and that path
    (``bucket/key`` for S3 and GCS); the filesystem is looked up once per bucket or host."""
    parts = urlsplit(url)
    if parts.scheme.lower() in BUCKET_SCHEMES and not parts.netloc:
        raise InputError(
            f"names no bucket; write {parts.scheme.lower()}://BUCKET/PATH (the bucket comes right after '://')",
            path=url,
        )
    _, base = filesystem(parts.scheme.lower(), parts.netloc, url)
    below = unquote(parts.path).lstrip("/")
    key = f"{base.rstrip('/')}/{below}" if below else base
    text = f"{parts.scheme}://{parts.netloc}/{below}" if below else f"{parts.scheme}://{parts.netloc}"
    root = text[: len(text) - len(key)] if key and text.endswith(key) else f"{parts.scheme}://"
    return RemotePath(root, key)


@functools.lru_cache(maxsize=64)
def filesystem(scheme: str, netloc: str, url: str) -> tuple[Any, str]:
    """pyarrow's filesystem for one bucket or host, and the filesystem path of its root (cached: S3 resolves a
    bucket's region once). ``url`` only names the input in errors."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    try:
        fs, base = pafs.FileSystem.from_uri(f"{scheme}://{netloc}/")
    except pa.ArrowInvalid:
        return _fsspec_filesystem(scheme, netloc, url)
    except (OSError, ValueError) as exc:
        raise storage_error(exc, url) from None
    return _bounded(fs), base


def _bounded(fs: Any) -> Any:
    """``fs`` rebuilt with rcdiag's timeouts (S3's connect and request timeouts, GCS's retry limit); another
    filesystem as it is. pyarrow's URL parser takes no timeouts, so the options it chose are copied."""
    import datetime

    import pyarrow.fs as pafs

    if isinstance(fs, pafs.S3FileSystem):
        bounds: dict[str, float | datetime.timedelta] = {
            "connect_timeout": CONNECT_TIMEOUT.seconds(),
            "request_timeout": REQUEST_TIMEOUT.seconds(),
        }
    elif isinstance(fs, pafs.GcsFileSystem):
        bounds = {"retry_time_limit": datetime.timedelta(seconds=RETRY_LIMIT.seconds())}
    else:
        return fs
    rebuild, (options,) = fs.__reduce__()
    return rebuild({**options, **bounds})


def _fsspec_filesystem(scheme: str, netloc: str, url: str) -> tuple[Any, str]:
    """A scheme pyarrow lacks, through fsspec (when installed and it knows the scheme)."""
    try:
        import fsspec
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        cls = fsspec.get_filesystem_class(scheme)
    except (ImportError, ValueError):
        raise InputError(
            f"uses '{scheme}://', which neither pyarrow nor an installed fsspec filesystem reads; use s3://, gs://, "
            "hdfs:// or file://",
            path=url,
        ) from None
    needs = [
        name
        for name, param in inspect.signature(cls.__init__).parameters.items()
        if name != "self" and param.default is param.empty and param.kind in (param.POSITIONAL_OR_KEYWORD,)
    ]
    if needs:  # e.g. ftp's host: settings a bare URL does not pass; refused before an instance half-exists
        raise InputError(
            f"uses '{scheme}://', whose fsspec filesystem needs settings a URL does not give ({', '.join(needs)}); "
            "use s3://, gs://, hdfs:// or file://",
            path=url,
        )
    try:
        impl = cls()
    except Exception as exc:  # a third-party constructor: any failure is this URL's, not rcdiag's
        raise InputError(
            f"uses '{scheme}://', whose fsspec filesystem cannot be opened ({_first_line(exc)})", path=url
        ) from None
    return PyFileSystem(FSSpecHandler(impl)), impl._strip_protocol(f"{scheme}://{netloc}")


def _fs(path: RemotePath) -> Any:
    parts = urlsplit(str(path))
    return filesystem(parts.scheme.lower(), parts.netloc, str(path))[0]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


UNREACHABLE = ("Could not resolve", "NETWORK_CONNECTION", "UNAVAILABLE", "timed out", "Timeout", "OAuth2")
"""What a service that cannot be reached (or a credential lookup that failed) says."""


def storage_error(exc: BaseException, url: str, *, action: str = "read") -> InputError:
    """One line for a storage failure: not found, no bucket, no permission, unreachable, or the service's first
    line. ``action`` is what failed: ``read`` or ``written``."""
    text = str(exc)
    if isinstance(exc, FileNotFoundError):
        return InputError("not found", path=url)
    if "NO_SUCH_BUCKET" in text or "NoSuchBucket" in text:
        return InputError("its bucket does not exist (or is not visible with these credentials)", path=url)
    if any(code in text for code in ("ACCESS_DENIED", "AccessDenied", "INVALID_ACCESS_KEY", "SIGNATURE", "403")):
        return InputError(
            "access denied; check the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID, ~/.aws/credentials or the "
            "machine's role) and the endpoint (AWS_ENDPOINT_URL)",
            path=url,
        )
    if any(mark in text for mark in UNREACHABLE):
        bounds = RETRY_LIMIT.env if scheme_of(url) in ("gs", "gcs") else CONNECT_TIMEOUT.env
        return InputError(
            f"cannot be {action}: the storage service or its credentials could not be reached in time (bound by "
            f"{bounds}; docs/storage.md): {_first_line(exc)}",
            path=url,
        )
    return InputError(f"cannot be {action} ({_first_line(exc)})", path=url)


def file_info(path: RemotePath) -> Any:
    """pyarrow's ``FileInfo`` of one path (``FileType.NotFound`` when absent)."""
    try:
        return _fs(path).get_file_info(path.key)
    except OSError as exc:
        raise storage_error(exc, str(path)) from None


def is_dir(path: RemotePath) -> bool:
    from pyarrow.fs import FileType

    return file_info(path).type == FileType.Directory


def listing(root: RemotePath) -> list[tuple[RemotePath, tuple[str, ...]]]:
    """Every file under ``root`` (recursively), with its path parts below ``root``."""
    from pyarrow.fs import FileSelector, FileType

    try:
        infos = _fs(root).get_file_info(FileSelector(root.key.rstrip("/"), recursive=True))
    except OSError as exc:
        raise storage_error(exc, str(root)) from None
    base = len(root.parts)
    found = []
    for info in infos:
        if info.type == FileType.File:
            file = RemotePath(root.root, info.path)
            found.append((file, file.parts[base:]))
    return found


def glob(pattern: RemotePath) -> list[RemotePath]:
    """The files a glob matches: ``*``, ``?`` and ``[...]`` within one path part, ``**`` across parts. The
    listing starts at the deepest part without a wildcard."""
    parts = pattern.parts
    fixed = next(i for i, part in enumerate(parts) if any(ch in part for ch in "*?["))
    top = RemotePath(pattern.root, "/".join(parts[:fixed]))
    if not top.parts:
        raise InputError("has a wildcard in the bucket name; name the bucket", path=str(pattern))
    return [file for file, below in listing(top) if _matches(below, parts[fixed:])]


def _matches(parts: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_matches(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _matches(parts[1:], pattern[1:])


def missing(path: RemotePath) -> InputError:
    """Why ``path`` is absent: its bucket does not exist, or nothing has this name."""
    from pyarrow.fs import FileType

    bucket = RemotePath(path.root, path.parts[0]) if path.parts else path
    if len(path.parts) > 1 and file_info(bucket).type == FileType.NotFound:
        return InputError(
            f"bucket '{bucket.key}' does not exist (or is not visible with these credentials)", path=str(path)
        )
    return InputError("not found (no object or prefix of this name)", path=str(path))


def open_input(path: RemotePath, *, buffered: bool = False) -> Any:
    """A pyarrow random-access file (reads fetch byte ranges), or a buffered stream for sequential reading."""
    try:
        if buffered:
            return _fs(path).open_input_stream(path.key, buffer_size=READ_BUFFER)
        return _fs(path).open_input_file(path.key)
    except OSError as exc:
        raise storage_error(exc, str(path)) from None


def open_text(path: RemotePath) -> IO[str]:
    """A UTF-8 text stream over the object, read through a buffer."""
    return io.TextIOWrapper(open_input(path, buffered=True), encoding="utf-8")


def read_bytes(path: RemotePath) -> bytes:
    """A whole small object (a state file)."""
    with open_input(path, buffered=True) as handle:
        return handle.read()


def write_bytes(path: RemotePath, data: bytes) -> None:
    """Write a small object in one upload (the object appears whole or not at all)."""
    try:
        with _fs(path).open_output_stream(path.key) as handle:
            handle.write(data)
    except OSError as exc:
        raise storage_error(exc, str(path), action="written") from None


def identity(path: RemotePath) -> dict[str, object]:
    """URL, size and modification time of an object (``merge`` compares them)."""
    info = file_info(path)
    return {"path": str(path), "size": info.size, "mtime_ns": info.mtime_ns}


FilePath = Path | RemotePath
"""A file of a dump: on the local disk, or in object storage."""
