"""Write and read replay state to a local directory or any ``pyarrow.fs`` URI (``s3://``, ...).

A snapshot is one pickle (protocol 5) of a shard's ``state_dict``. Writes go to a temporary name
first and are then moved into place, so a reader never sees a half-written file.

Where snapshots live decides what survives: a shard restarted on another node reads its snapshot
there, so on a cluster of several machines the snapshot directory must be storage every node
reaches (an ``s3://``/``gs://``/``hdfs://`` URI, or a local path that is a shared mount such as
NFS). A plain local directory only works when every node runs on one machine.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any


def _filesystem(uri: str):
    import pyarrow.fs as pafs  # pyarrow comes with Ray, which the distributed replay needs

    if "://" in uri:
        return pafs.FileSystem.from_uri(uri)
    return pafs.LocalFileSystem(), resolve(uri)


def is_local(uri: str) -> bool:
    """Whether ``uri`` names a local path (no ``scheme://``; ``file://`` counts as local)."""
    return "://" not in uri or uri.startswith("file://")


def resolve(uri: str) -> str:
    """``uri`` with a local path made absolute (against this process's working directory), so
    that actors started in other directories or on other nodes name the same place."""
    if "://" in uri:
        return uri
    return str(Path(uri).expanduser().resolve())


def join(uri: str, name: str) -> str:
    """``uri/name`` for both local paths and URIs; a URI's query (``?endpoint_override=...``,
    the object store's address and options) stays after the path."""
    base, mark, query = uri.partition("?") if "://" in uri else (uri, "", "")
    return f"{base.rstrip('/')}/{name}{mark}{query}"


def write_state(uri: str, state: Any) -> None:
    """Atomically write ``state`` (picklable) to the file ``uri``."""
    fs, path = _filesystem(uri)
    parent = path.rsplit("/", 1)[0]
    fs.create_dir(parent, recursive=True)
    tmp = f"{path}.tmp"
    with fs.open_output_stream(tmp) as stream:
        pickle.dump(state, stream, protocol=5)
    fs.move(tmp, path)


def read_state(uri: str) -> Any | None:
    """The state stored at ``uri``, or ``None`` when there is no such file."""
    import pyarrow.fs as pafs

    fs, path = _filesystem(uri)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as stream:
        return pickle.loads(stream.read())


def write_text(uri: str, text: str) -> None:
    fs, path = _filesystem(uri)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as stream:
        stream.write(text.encode())


def read_text(uri: str) -> str | None:
    import pyarrow.fs as pafs

    fs, path = _filesystem(uri)
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as stream:
        return stream.read().decode()
