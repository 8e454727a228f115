"""The sessions a shared model host (model_host.py --listen) holds, shared between its
connections: two workers that open the same model file get the same session, so the
device holds one copy, and a session no connection uses any more is closed.

A session is the same when the file is: its resolved path, modification time and size
(a new model version is a new file, pipeline/versions/, so after a hot swap each worker
opens the new one and shares it with the others that swapped), with the same providers
and intra-op threads and device keys. Sessions are made through InferenceSession (session.py) as the
model process of one worker makes its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

Key = tuple[str, int, int, str, int, str]


class SharedModel:
    """One session and who uses it; `counts` are the runner's (host_runner.py)."""

    def __init__(self, handle: int, key: Key, session: Any) -> None:
        self.handle = handle
        self.key = key
        self.name = Path(key[0]).name
        self.session = session
        self.users = 0
        self.no_join: str | None = None
        self.counts: dict[str, int] = {}

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        return self.session.run(feeds)

    def hello(self) -> dict[str, Any]:
        s = self.session
        return {"handle": self.handle, "provider": s.provider, "input_names": s.input_names, "output_names": s.output_names}


def model_key(path: str, providers: str, threads: int, options: str | None = None) -> Key:
    """Raises OSError when there is no such file."""
    resolved = Path(path).resolve()
    st = resolved.stat()
    return (str(resolved), st.st_mtime_ns, st.st_size, providers, threads, options or "")


class Models:
    """The open sessions by key and by handle. `open_session(path, providers, threads,
    options)` makes a session (raises UserError when the model does not load); options:
    the worker's device keys as JSON (pipeline/runtime/device.py), or None."""

    def __init__(self, open_session: Callable[[str, str, int, str | None], Any]) -> None:
        self._open = open_session
        self._lock = threading.Lock()
        self._by_key: dict[Key, SharedModel] = {}
        self._loading: dict[Key, threading.Lock] = {}
        self._next_handle = 1
        self.opened = 0  # sessions made, over the host's life

    def open(self, path: str, providers: str, threads: int, options: str | None = None) -> SharedModel:
        """The session for this file and settings, made if no connection has it open;
        one more user either way. Two workers asking for the same new model at once
        load it once; a load holds only its own key's lock, so the host's loop
        (releases, stats) never waits for a model to load."""
        key = model_key(path, providers, threads, options)
        with self._lock:
            if (model := self._use(key)) is not None:
                return model
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:
            with self._lock:
                if (model := self._use(key)) is not None:
                    return model
            session = self._open(key[0], providers, threads, options)
            with self._lock:
                self._loading.pop(key, None)
                model = SharedModel(self._next_handle, key, session)
                self._next_handle += 1
                self.opened += 1
                self._by_key[key] = model
                model.users += 1
                return model

    def _use(self, key: Key) -> SharedModel | None:
        model = self._by_key.get(key)
        if model is not None:
            model.users += 1
        return model

    def release(self, model: SharedModel) -> None:
        """One user fewer; the last one closes the session (requests still queued for
        it keep their reference and run)."""
        with self._lock:
            model.users -= 1
            if model.users <= 0 and self._by_key.get(model.key) is model:
                del self._by_key[model.key]
                model.session.close()

    def snapshot(self) -> list[SharedModel]:
        with self._lock:
            return list(self._by_key.values())
