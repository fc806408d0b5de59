"""Where a store lives: a local directory or an S3-compatible bucket, behind one Location.

Every reader and writer of the store goes through :class:`Location` (a small pathlib-like
value over a ``pyarrow.fs`` filesystem), so the rest of the lab never knows whether a run
sits on disk or in an object store. ``s3://bucket/prefix`` roots take their credentials the
way every AWS tool does (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` and the shared config files, ``AWS_REGION``), and
the endpoint of an S3-compatible store from ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL`` (e.g. ``http://127.0.0.1:8333``).

Commit without rename: an object store has no rename, so :meth:`Location.write_bytes`
commits a file as one PUT of the whole object (S3 makes an object visible whole or not at
all); on a local disk it writes a hidden temporary file, fsyncs and renames it. Either way a
reader never sees half a file. Names beginning with ``.`` are hidden: never listed, never a
run (an import or migration in progress writes there).
"""

from __future__ import annotations

import fnmatch
import os
import re
import threading
from collections.abc import Callable, Collection, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow.fs as pafs

from dsparklab.errors import DSparkLabError
from dsparklab.store.schema import TEMP_SUFFIX

S3_SCHEME = "s3://"
# Endpoint override variables, most specific first (the AWS SDKs' own names).
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
_SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
# Seconds an S3 request may take before it fails (the plugin must never stall on a store).
S3_CONNECT_TIMEOUT_S = 5.0
S3_REQUEST_TIMEOUT_S = 20.0


class StoreAccessError(DSparkLabError, OSError):
    """The store cannot be reached or refuses us: endpoint down, wrong credentials, missing
    bucket. The message names the location and never carries a secret."""

    def __init__(self, message: str, *, location: str) -> None:
        self.location = location
        super().__init__(f"store {location}: {redact(message)}")


def redact(text: str) -> str:
    """``text`` with every AWS secret of this process's environment replaced by ``***``
    (error texts from the S3 client may echo request headers)."""
    for name in _SECRET_VARIABLES:
        secret = os.environ.get(name)
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    # signatures and credentials in query strings or headers
    return re.sub(r"(Signature|Credential|X-Amz-Security-Token)=[^&\s,]+", r"\1=***", text)


def one_line(err: BaseException) -> str:
    """An S3 client's error text as one line without secrets: its first line, which says
    what failed (AWS error code and message)."""
    text = " ".join(str(err).split("\n")[0].split())
    return redact(text or type(err).__name__)


_LOCAL = pafs.LocalFileSystem()
_FILESYSTEMS: dict[tuple[Any, ...], pafs.FileSystem] = {}
_FILESYSTEMS_LOCK = threading.Lock()


def _s3_filesystem() -> pafs.FileSystem:
    """One S3 filesystem per distinct set of AWS variables (a test or a user may change them)."""
    endpoint = next((os.environ[v] for v in ENDPOINT_VARIABLES if os.environ.get(v)), None)
    key = tuple(
        os.environ.get(v)
        for v in (
            *_SECRET_VARIABLES,
            "AWS_PROFILE",
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            *ENDPOINT_VARIABLES,
        )
    )
    with _FILESYSTEMS_LOCK:
        if key not in _FILESYSTEMS:
            options: dict[str, Any] = {
                "connect_timeout": S3_CONNECT_TIMEOUT_S,
                "request_timeout": S3_REQUEST_TIMEOUT_S,
                "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=2),
                # buckets are made by their owners; a missing one is an error, not a surprise
                "allow_bucket_creation": False,
                "allow_bucket_deletion": False,
            }
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            if region:
                options["region"] = region
            if endpoint:
                scheme, _, rest = endpoint.partition("://")
                options["endpoint_override"] = rest.rstrip("/") if rest else scheme
                options["scheme"] = scheme if rest else "https"
                # S3-compatible stores are addressed by path, not by virtual host
                options["force_virtual_addressing"] = False
            _FILESYSTEMS[key] = pafs.S3FileSystem(**options)
        return _FILESYSTEMS[key]


class Location:
    """A file or directory in the store: ``location / "steps"``, ``.read_bytes()``...

    Built from a local path or an ``s3://bucket/key`` URI with :meth:`of`; ``str()`` gives
    the URI back (a local location prints as its path).
    """

    __slots__ = ("fs", "path", "scheme")

    def __init__(self, fs: pafs.FileSystem, path: str, scheme: str = "") -> None:
        self.fs = fs
        self.path = path
        self.scheme = scheme

    @classmethod
    def of(cls, where: Location | Path | str) -> Location:
        if isinstance(where, Location):
            return where
        text = str(where)
        if text.startswith(S3_SCHEME):
            key = text[len(S3_SCHEME) :].strip("/")
            if not key:
                raise StoreAccessError("an s3:// location needs a bucket", location=text)
            return cls(_s3_filesystem(), key, S3_SCHEME)
        if "://" in text:
            raise StoreAccessError(
                "unsupported scheme (a local path or s3://bucket/prefix)", location=text
            )
        return cls(_LOCAL, str(Path(text)), "")

    # -- naming ------------------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        return not self.scheme

    @property
    def uri(self) -> str:
        return f"{self.scheme}{self.path}"

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    @property
    def parent(self) -> Location:
        return Location(self.fs, str(PurePosixPath(self.path).parent), self.scheme)

    def __truediv__(self, name: str) -> Location:
        return Location(self.fs, f"{self.path.rstrip('/')}/{name}", self.scheme)

    def relative_to(self, other: Location | Path | str) -> str:
        return str(PurePosixPath(self.path).relative_to(Location.of(other).path))

    def local_path(self) -> Path:
        """The local path (a process-local step such as a subprocess's working directory);
        raises on an object store."""
        if not self.is_local:
            raise StoreAccessError(
                "needs a local directory, not an object store", location=self.uri
            )
        return Path(self.path)

    def __fspath__(self) -> str:
        return str(self.local_path())

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        return f"Location({self.uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    def __lt__(self, other: Location) -> bool:
        return self.uri < other.uri

    # -- looking -----------------------------------------------------------------------
    def _info(self) -> pafs.FileInfo:
        try:
            return self.fs.get_file_info(self.path)
        except OSError as err:
            raise StoreAccessError(one_line(err), location=self.uri) from err

    def exists(self) -> bool:
        return self._info().type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        return self._info().type == pafs.FileType.File

    def is_dir(self) -> bool:
        return self._info().type == pafs.FileType.Directory

    def check_bucket(self) -> None:
        """Raise unless this object-store location's bucket exists (some S3-compatible
        stores create a missing bucket on the first PUT; dsparklab never makes one)."""
        if self.is_local:
            return
        bucket = Location(self.fs, self.path.split("/", 1)[0], self.scheme)
        if bucket._info().type == pafs.FileType.NotFound:
            raise StoreAccessError(
                f"bucket {bucket.path!r} does not exist; create it first", location=self.uri
            )

    def _walk(self, recursive: bool) -> list[pafs.FileInfo]:
        try:
            return self.fs.get_file_info(
                pafs.FileSelector(self.path, allow_not_found=True, recursive=recursive)
            )
        except OSError as err:
            raise StoreAccessError(one_line(err), location=self.uri) from err

    def files(self, pattern: str = "*") -> list[Location]:
        """The visible files directly in this directory whose names match ``pattern``,
        sorted by name."""
        found = [
            Location(self.fs, info.path, self.scheme)
            for info in self._walk(recursive=False)
            if info.type == pafs.FileType.File
            and not info.base_name.startswith(".")
            and fnmatch.fnmatchcase(info.base_name, pattern)
        ]
        return sorted(found, key=lambda loc: loc.name)

    def find(
        self, name: str, skip: Callable[[list[str]], Collection[str]] | None = None
    ) -> Iterator[Location]:
        """Every visible file called ``name`` below this directory, in path order; hidden
        directories (``.<name>``) are not entered, nor (on a local walk) the ones ``skip``
        names among a directory's subdirectories. An object store lists every key below
        in one call, ``skip`` or not."""
        if self.is_local:  # os.walk prunes hidden directories instead of listing them
            for top, dirs, files in os.walk(self.path):
                skipped = skip(dirs) if skip is not None else ()
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in skipped)
                if name in files:
                    yield Location(self.fs, f"{top}/{name}", self.scheme)
            return
        root = PurePosixPath(self.path)
        for info in sorted(self._walk(recursive=True), key=lambda i: i.path):
            parts = PurePosixPath(info.path).relative_to(root).parts
            if info.base_name == name and not any(p.startswith(".") for p in parts):
                yield Location(self.fs, info.path, self.scheme)

    def walk_files(self) -> list[Location]:
        """Every file below this directory, hidden ones included, in path order."""
        return sorted(
            Location(self.fs, info.path, self.scheme)
            for info in self._walk(recursive=True)
            if info.type == pafs.FileType.File
        )

    def file_sizes(self) -> list[tuple[str, int]]:
        """(path relative to this directory, size in bytes) of every visible file below it,
        in path order: one listing, no file opened."""
        root = PurePosixPath(self.path)
        found = []
        for info in self._walk(recursive=True):
            if info.type != pafs.FileType.File:
                continue
            parts = PurePosixPath(info.path).relative_to(root).parts
            if not any(p.startswith(".") for p in parts):
                found.append(("/".join(parts), int(info.size)))
        return sorted(found)

    # -- reading -----------------------------------------------------------------------
    def read_bytes(self) -> bytes:
        try:
            with self.fs.open_input_stream(self.path) as fh:
                return bytes(fh.read())
        except FileNotFoundError:
            raise
        except OSError as err:
            if self.is_local and not self.is_file():
                raise FileNotFoundError(self.uri) from err
            raise StoreAccessError(one_line(err), location=self.uri) from err

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    # -- writing -----------------------------------------------------------------------
    def mkdir(self) -> None:
        """Make the directory (and its parents) on a local disk; object stores have none."""
        if self.is_local:
            Path(self.path).mkdir(parents=True, exist_ok=True)

    def write_bytes(self, data: bytes) -> None:
        """Commit ``data`` as this file, whole: a local temp file + fsync + rename, or one
        PUT of the object."""
        if self.is_local:
            target = Path(self.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            # hidden, and unique to this thread: no reader lists it, no writer shares it
            tmp = target.with_name(
                f".{target.name}.{os.getpid()}-{threading.get_ident()}{TEMP_SUFFIX}"
            )
            with tmp.open("wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            tmp.replace(target)
            fd = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            return
        try:
            with self.fs.open_output_stream(self.path) as fh:
                fh.write(data)
        except OSError as err:
            raise StoreAccessError(one_line(err), location=self.uri) from err

    def delete(self) -> None:
        """Remove this file, or this directory and everything below it."""
        try:
            info = self._info()
            if info.type == pafs.FileType.Directory:
                self.fs.delete_dir(self.path)
            elif info.type == pafs.FileType.File:
                self.fs.delete_file(self.path)
        except OSError as err:
            raise StoreAccessError(one_line(err), location=self.uri) from err


Where = Location | Path | str
