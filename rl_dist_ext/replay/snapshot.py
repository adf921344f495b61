"""Replay snapshots: data, never code, on a local disk or any ``pyarrow.fs`` URI (``s3://``, ...).

A snapshot *location* (a directory, or a prefix on an object store) holds numbered generations;
each is two files::

    000000000007.arrow   the rows: an Arrow IPC file, one column per replay column
    000000000007.json    the header, written last: format version, schema, state, checksums

Nothing in either file is executed on read: the columns are numbers and bytes, the header is
JSON. Reading checks, before the rows are used, the header's own checksum, its format version,
the data file's size, the Arrow schema against the header's, and a CRC-32 per column; a failure
raises :class:`ReplaySnapshotCorrupt` naming the file and what failed. Checksums find damage
(truncation, flipped bits, a mixed-up file); they are no signature: whoever can write the
location can write a valid snapshot of other rows, but never make a reader run code.

Writing streams the rows in record batches of at most :data:`CHUNK_BYTES` (the extra memory a
save takes beyond the replay: one batch's Arrow copy, where a column is not zero-copy, and the
object columns' blobs of one batch). A local data file is flushed to disk (``fsync``) before
its header is written to a temporary name, flushed and renamed into place; on object stores,
which have no atomic rename, the header is written last, and a generation without a complete,
checksummed header does not count. Once a generation is complete the one before it is kept (a
reader falls back to it when the newest is damaged) and older files are deleted.

Where snapshots live decides what survives: a shard restarted on another node reads its snapshot
there, so on a cluster of several machines the snapshot location must be storage every node
reaches (an ``s3://``/``gs://``/``hdfs://`` URI, or a local path that is a shared mount such as
NFS). A plain local directory only works when every node runs on one machine.

Snapshots written as pickles by earlier versions (``<location>.pkl``) are refused with
:class:`LegacyPickleSnapshot`; :mod:`rl_dist_ext.replay.convert_pickle_snapshot` converts files
the user trusts.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rl_dist_ext.replay.snapshot_columns import (
    CHUNK_BYTES,
    SnapshotUnsupported,
    check_header_column,
    column_schema,
    min_data_bytes,
    read_columns,
    write_columns,
)

__all__ = [
    "CHUNK_BYTES",
    "Generation",
    "LegacyPickleSnapshot",
    "ReplaySnapshotCorrupt",
    "Snapshot",
    "SnapshotUnsupported",
    "generations",
    "is_local",
    "join",
    "read_snapshot",
    "read_text",
    "resolve",
    "write_snapshot",
    "write_text",
]

FORMAT = "rl-dist-ext replay snapshot"
VERSION = 1
#: A header holds a schema and counters: anything larger is not one of ours.
MAX_HEADER_BYTES = 16 * 2**20
_NAME = re.compile(r"^(\d{12})\.(arrow|json|arrow\.rejected|json\.rejected)$")


class ReplaySnapshotCorrupt(Exception):
    """A snapshot that cannot be used. ``reason``: ``"truncated"`` (shorter than its header
    says), ``"format"`` (not a valid Arrow file), ``"checksum"`` (a column or the header does
    not match its CRC), ``"schema"`` (columns or content that do not fit the header or the
    replay), ``"version"`` (a newer format), ``"header"`` (not a snapshot header) or
    ``"pickle"`` (:class:`LegacyPickleSnapshot`)."""

    def __init__(self, uri: str, reason: str, detail: str) -> None:
        super().__init__(f"replay snapshot {uri}: {reason}: {detail}")
        self.uri, self.reason, self.detail = uri, reason, detail

    def __reduce__(self):  # raised in a shard actor, re-raised in the caller
        return type(self), (self.uri, self.reason, self.detail)


class LegacyPickleSnapshot(ReplaySnapshotCorrupt):
    """A snapshot written as a pickle by an earlier version: not loaded, since unpickling a file
    runs whatever code it names."""

    def __init__(self, uri: str, reason: str = "pickle", detail: str = "") -> None:
        detail = detail or (
            "this is a pickle written by rl-dist-ext 0.x; it is not loaded, because unpickling "
            "runs any code the file names. If you trust the file, convert it once with "
            f"`python -m rl_dist_ext.replay.convert_pickle_snapshot {uri}`"
        )
        super().__init__(uri, reason, detail)


@dataclass
class Snapshot:
    """One generation's content: ``state`` (JSON-able counters and settings) and row-aligned
    ``columns`` (numeric arrays ``[rows, ...]``, or object arrays of ``bytes``/``None``)."""

    state: dict[str, Any]
    columns: dict[str, np.ndarray]
    source: str = ""  # the header file it was read from

    @property
    def rows(self) -> int:
        return next(iter(self.columns.values())).shape[0] if self.columns else 0


# ---- locations ----------------------------------------------------------------------------------
def filesystem(uri: str):
    """The pyarrow filesystem holding ``uri`` and the path on it (a local path made absolute)."""
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


def _is_file(fs, path: str) -> bool:
    import pyarrow.fs as pafs

    return fs.get_file_info(path).type == pafs.FileType.File


def write_text(uri: str, text: str) -> None:
    fs, path = filesystem(uri)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as stream:
        stream.write(text.encode())


def read_text(uri: str) -> str | None:
    fs, path = filesystem(uri)
    if not _is_file(fs, path):
        return None
    with fs.open_input_stream(path) as stream:
        return stream.read().decode()


def _generations(fs, path: str) -> dict[int, set[str]]:
    """generation -> the suffixes (``arrow``, ``json``; ``*.rejected`` for files a shard renamed
    aside) present at the location ``path``."""
    import pyarrow.fs as pafs

    found: dict[int, set[str]] = {}
    for info in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)):
        match = _NAME.match(info.base_name)
        if match and info.type == pafs.FileType.File:
            found.setdefault(int(match[1]), set()).add(match[2])
    return found


def _file(path: str, generation: int, suffix: str) -> str:
    return f"{path}/{generation:012d}.{suffix}"


def _legacy(uri: str) -> str | None:
    """The pickle an earlier version wrote for the location ``uri`` (the location itself as a
    file, or ``<location>.pkl``), as the user would name it; ``None`` if there is none."""
    fs, path = filesystem(uri)
    if _is_file(fs, path):
        return uri
    if _is_file(fs, f"{path}.pkl"):
        base, mark, query = uri.partition("?") if "://" in uri else (uri, "", "")
        return f"{base.rstrip('/')}.pkl{mark}{query}"
    return None


# ---- writing ------------------------------------------------------------------------------------
def write_snapshot(
    uri: str,
    state: Mapping[str, Any],
    columns: Mapping[str, np.ndarray],
    *,
    keep_previous: bool = True,
    chunk_bytes: int = CHUNK_BYTES,
) -> int:
    """Write a new generation at the location ``uri``; returns its number. ``columns`` are read,
    not copied (the caller keeps them unchanged until this returns); ``chunk_bytes`` bounds a
    record batch. ``keep_previous=False`` deletes every older generation once this one is
    complete (a fresh replay's first snapshot: older ones hold another run's rows)."""
    schema, rows = column_schema(columns)
    fs, path = filesystem(uri)
    fs.create_dir(path, recursive=True)
    generation = max(_generations(fs, path), default=0) + 1
    data = _file(path, generation, "arrow")
    with _output(fs, data) as sink:
        write_columns(sink, schema, columns, rows, chunk_bytes)
    header = {
        "format": FORMAT,
        "version": VERSION,
        "generation": generation,
        "data_file": data.rsplit("/", 1)[1],
        "data_bytes": fs.get_file_info(data).size,
        "rows": rows,
        "columns": schema,
        "state": dict(state),
    }
    header["header_crc32"] = _header_crc(header)
    _write_header(fs, _file(path, generation, "json"), json.dumps(header, indent=1))
    _prune(fs, path, generation, keep_previous=keep_previous)
    return generation


class _output:
    """A data file's output stream; a local one is flushed to disk (``fsync``) once closed."""

    def __init__(self, fs, path: str) -> None:
        self._path = path if _is_local_fs(fs) else None
        self._file = fs.open_output_stream(path)

    def __enter__(self):
        return self._file

    def __exit__(self, *exc) -> None:
        self._file.close()
        if self._path is not None:
            fd = os.open(self._path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _is_local_fs(fs) -> bool:
    import pyarrow.fs as pafs

    return isinstance(fs, pafs.LocalFileSystem)


def _write_header(fs, path: str, text: str) -> None:
    if not _is_local_fs(fs):
        with fs.open_output_stream(path) as stream:
            stream.write(text.encode())
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _prune(fs, path: str, newest: int, *, keep_previous: bool) -> None:
    """Keep ``newest`` and (``keep_previous``) the newest complete generation before it; delete
    the rest, each header before its data (a generation without a header does not count)."""
    found = _generations(fs, path)
    complete = sorted(g for g, kinds in found.items() if kinds == {"arrow", "json"} and g < newest)
    keep = {newest, *complete[-1:]} if keep_previous else {newest}
    for generation, kinds in found.items():
        if generation not in keep and generation < newest:
            for suffix in sorted(kinds, key=lambda kind: kind != "json"):
                fs.delete_file(_file(path, generation, suffix))


def _header_crc(header: Mapping[str, Any]) -> int:
    body = {k: v for k, v in header.items() if k != "header_crc32"}
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


# ---- reading ------------------------------------------------------------------------------------
class Generation:
    """One numbered generation at a location; :meth:`read` loads and checks it."""

    def __init__(self, uri: str, fs, path: str, number: int) -> None:
        self.uri, self.number = uri, number
        self._fs, self._path = fs, path

    @property
    def name(self) -> str:
        """The header file, as the user would name it."""
        return _shown(_file(self._path, self.number, "json"), self.uri)

    def read(self, *, max_rows: int | None = None) -> Snapshot:
        """The generation's content; :class:`ReplaySnapshotCorrupt` if it is damaged, holds
        more than ``max_rows`` rows (the reader's capacity), or cannot be read."""
        file = _file(self._path, self.number, "json")
        try:
            return _read_generation(self._fs, self._path, self.number, self.uri, max_rows)
        except ReplaySnapshotCorrupt:
            raise
        except Exception as error:  # the storage failed (e.g. NFS, a file deleted meanwhile)
            raise ReplaySnapshotCorrupt(
                _shown(file, self.uri), "unreadable", f"{type(error).__name__}: {error}"
            ) from None

    def quarantine(self) -> None:
        """Rename the generation's files to ``*.rejected``: kept for a look, no longer a
        generation (a later save then keeps a good one as the previous, not this)."""
        for suffix in ("json", "arrow"):
            file = _file(self._path, self.number, suffix)
            with contextlib.suppress(OSError, FileNotFoundError):
                self._fs.move(file, f"{file}.rejected")


def generations(uri: str) -> list[Generation]:
    """The generations at the location ``uri`` that have a header, newest first (empty when
    there is none); :class:`LegacyPickleSnapshot` where only an earlier version's pickle is."""
    fs, path = filesystem(uri)
    found = {} if _is_file(fs, path) else _generations(fs, path)
    headed = sorted((g for g, kinds in found.items() if "json" in kinds), reverse=True)
    if not headed:
        legacy = _legacy(uri)
        if legacy is not None:
            raise LegacyPickleSnapshot(legacy)
    return [Generation(uri, fs, path, g) for g in headed]


def read_snapshot(uri: str) -> Snapshot | None:
    """The newest generation at the location ``uri`` (``None`` when there is none); raises
    :class:`ReplaySnapshotCorrupt` when it is damaged (see :func:`generations` to fall back)."""
    found = generations(uri)
    return found[0].read() if found else None


def _read_generation(
    fs, path: str, generation: int, uri: str, max_rows: int | None = None
) -> Snapshot:
    import pyarrow as pa

    header_file = _file(path, generation, "json")
    header = _read_header(fs, header_file, uri)
    data_file = _file(path, generation, "arrow")
    corrupt = _corrupt(data_file, uri)
    if max_rows is not None and header["rows"] > max_rows:
        raise corrupt("schema", f"{header['rows']} rows, more than the {max_rows} it may hold")
    least = min_data_bytes(header["columns"], header["rows"])
    if least > header["data_bytes"]:
        raise corrupt(
            "schema", f"{header['rows']} rows need at least {least} bytes, the file has fewer"
        )
    if header["generation"] != generation or header["data_file"] != data_file.rsplit("/", 1)[1]:
        raise corrupt("header", f"the header names generation {header['generation']}'s files")
    info = fs.get_file_info(data_file)
    if info.size is None or info.size < 0:
        raise corrupt("truncated", "the data file is missing")
    if info.size != header["data_bytes"]:
        raise corrupt("truncated", f"{info.size} bytes, the header says {header['data_bytes']}")
    try:
        source = pa.memory_map(data_file) if _is_local_fs(fs) else fs.open_input_file(data_file)
        with source:
            arrays = read_columns(
                source, header["columns"], header["rows"], header["data_bytes"], corrupt
            )
    except ReplaySnapshotCorrupt:
        raise
    except Exception as error:  # Arrow's errors on damaged IPC data
        raise corrupt(
            "format", f"not a valid Arrow IPC file: {type(error).__name__}: {error}"
        ) from None
    return Snapshot(state=header["state"], columns=arrays, source=_shown(header_file, uri))


def _shown(file: str, uri: str) -> str:
    """``file`` (a filesystem path) named as the user wrote its location ``uri``."""
    return f"{uri.split('://', 1)[0]}://{file}" if "://" in uri else file


def _corrupt(file: str, uri: str):
    """A maker of errors naming ``file``."""
    return lambda reason, detail: ReplaySnapshotCorrupt(_shown(file, uri), reason, detail)


def _read_header(fs, file: str, uri: str) -> dict[str, Any]:
    corrupt = _corrupt(file, uri)
    with fs.open_input_stream(file) as stream:
        raw = stream.read()
    if len(raw) > MAX_HEADER_BYTES:
        raise corrupt("header", f"{len(raw)} bytes, more than a header's {MAX_HEADER_BYTES}")
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as error:  # JSON, UTF-8, or int-digit-limit errors
        raise corrupt("truncated" if raw else "header", f"not valid JSON ({error})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise corrupt("header", "not an rl-dist-ext replay snapshot header")
    version = header.get("version")
    if not isinstance(version, int) or version > VERSION or version < 1:
        raise corrupt(
            "version",
            f"format version {version!r}; this rl-dist-ext reads versions 1 to {VERSION} "
            "(a newer version wrote it: upgrade rl-dist-ext to read it)",
        )
    if header.get("header_crc32") != _header_crc(header):
        raise corrupt("checksum", "the header's checksum does not match its content")
    try:
        _check_header(header)
    except (KeyError, TypeError, ValueError) as error:
        raise corrupt("schema", f"malformed header: {error}") from None
    return header


def _check_header(header: Mapping[str, Any]) -> None:
    for key, kind in (
        ("generation", int),
        ("data_bytes", int),
        ("rows", int),
        ("state", dict),
        ("data_file", str),
        ("columns", list),
    ):
        if not isinstance(header[key], kind) or isinstance(header[key], bool):
            raise TypeError(f"{key} must be {kind.__name__}, got {header[key]!r}")
    if header["rows"] < 0:
        raise ValueError(f"rows must be >= 0, got {header['rows']}")
    names: set[str] = set()
    for column in header["columns"]:
        check_header_column(column, names)
