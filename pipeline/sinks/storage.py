"""Where sink files go: a local directory (the default) or any fsspec URL.

Every write is all-or-nothing, so a reader never sees a partial file:

- local: write `.<name>.tmp` in the target directory, fsync it, rename it over the
  final name, fsync the directory (and any directory created on the way), so the file
  and its name both survive a power cut. The temporary name is fixed per final name:
  a rerun after a crash overwrites the leftover instead of piling up garbage, and the
  leading dot hides it from Spark, pyarrow datasets and `*.parquet` globs.
- fsspec (s3://, gs://, memory://, ...): one `pipe_file` upload; object stores make an
  object visible only once the upload completed. s3:// comes with the `s3` extra
  (fsspec + s3fs, pyproject.toml); another object store needs fsspec and its own
  filesystem package (gcsfs for gs://), installed by the deployment.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Protocol

from pipeline.errors import UserError
from pipeline.extras import missing

# The URL schemes s3fs registers with fsspec (the `s3` extra).
S3_PROTOCOLS = ("s3", "s3a")


class Storage(Protocol):
    root: str

    def put(self, rel: str, data: bytes) -> None:
        """Write `data` at `rel` (relative to the root), atomically and durably."""
        ...

    def get(self, rel: str) -> bytes | None:
        """The bytes at `rel`, or None when there is no such file."""
        ...

    def exists(self, rel: str) -> bool: ...


def open_storage(url: str) -> Storage:
    """A plain path or file:// URL gives LocalStorage; anything else goes to fsspec."""
    if "://" not in url:
        return LocalStorage(url)
    protocol, _, rest = url.partition("://")
    if protocol == "file":
        return LocalStorage(rest)
    return FsspecStorage(url)


class LocalStorage:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = str(Path(root).expanduser().absolute())
        self._known_dirs: set[str] = set()
        self._lock = threading.Lock()

    def _path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def check_writable(self) -> None:
        """At start, so a wrong path fails with a message instead of a worker crash later."""
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create {self.root}: {exc.strerror}") from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise UserError(f"{self.root} is not writable")

    def put(self, rel: str, data: bytes) -> None:
        final = self._path(rel)
        directory, name = os.path.split(final)
        self._make_dirs(directory)
        tmp = os.path.join(directory, f".{name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        _fsync_dir(directory)

    def _make_dirs(self, directory: str) -> None:
        """makedirs, then fsync each new directory's parent so its entry is durable."""
        with self._lock:
            if directory in self._known_dirs:
                return
        missing: list[str] = []
        d = directory
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        os.makedirs(directory, exist_ok=True)
        for new in reversed(missing):
            _fsync_dir(os.path.dirname(new))
        with self._lock:
            self._known_dirs.add(directory)

    def get(self, rel: str) -> bytes | None:
        try:
            with open(self._path(rel), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def exists(self, rel: str) -> bool:
        return os.path.isfile(self._path(rel))


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FsspecStorage:
    def __init__(self, url: str) -> None:
        s3 = url.partition("://")[0] in S3_PROTOCOLS
        try:
            import fsspec

            fs, root = fsspec.core.url_to_fs(url)
        except ImportError as exc:
            if s3:  # fsspec or s3fs missing: both come with the extra
                raise missing("s3", f"sink path {url}") from None
            raise UserError(f"sink path {url}: {str(exc).splitlines()[0]} "
                            "(needs fsspec and the filesystem package for the URL)") from None
        except ValueError as exc:
            raise UserError(f"sink path {url}: {str(exc).splitlines()[0]}") from None
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url

    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def put(self, rel: str, data: bytes) -> None:
        # Object stores publish an object only when its upload completes: atomic.
        self.fs.pipe_file(self._path(rel), data)

    def get(self, rel: str) -> bytes | None:
        try:
            return self.fs.cat_file(self._path(rel))
        except FileNotFoundError:
            return None

    def exists(self, rel: str) -> bool:
        return bool(self.fs.isfile(self._path(rel)))
