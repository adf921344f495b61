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

import json
import os
import re
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "rl-dist-ext replay snapshot"
VERSION = 1
#: Most bytes of rows one record batch holds while a snapshot is written.
CHUNK_BYTES = 16 * 2**20
#: Generations a location keeps: the newest complete one and the one before it.
KEEP = 2
_NAME = re.compile(r"^(\d{12})\.(arrow|json)$")
_NUMERIC_KINDS = "biuf"  # bool, signed and unsigned integers, floats
BYTES = "bytes"  # the header's dtype of a column of bytes objects (compressed observations)


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


class SnapshotUnsupported(TypeError):
    """A replay column the snapshot format cannot hold (it would need pickle)."""


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


def _is_file(fs, path: str) -> bool:
    import pyarrow.fs as pafs

    return fs.get_file_info(path).type == pafs.FileType.File


def write_text(uri: str, text: str) -> None:
    fs, path = _filesystem(uri)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as stream:
        stream.write(text.encode())


def read_text(uri: str) -> str | None:
    fs, path = _filesystem(uri)
    if not _is_file(fs, path):
        return None
    with fs.open_input_stream(path) as stream:
        return stream.read().decode()


def _generations(fs, path: str) -> dict[int, set[str]]:
    """generation -> the suffixes (``arrow``, ``json``) present at the location ``path``."""
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
    fs, path = _filesystem(uri)
    if _is_file(fs, path):
        return uri
    if _is_file(fs, f"{path}.pkl"):
        base, mark, query = uri.partition("?") if "://" in uri else (uri, "", "")
        return f"{base.rstrip('/')}.pkl{mark}{query}"
    return None


# ---- writing ------------------------------------------------------------------------------------
def write_snapshot(uri: str, state: Mapping[str, Any], columns: Mapping[str, np.ndarray]) -> int:
    """Write a new generation at the location ``uri``; returns its number. ``columns`` are read,
    not copied (the caller keeps them unchanged until this returns)."""
    import pyarrow as pa

    schema, rows = _schema(columns)
    fs, path = _filesystem(uri)
    fs.create_dir(path, recursive=True)
    existing = _generations(fs, path)
    generation = max(existing, default=0) + 1
    data = _file(path, generation, "arrow")
    crcs = {name: 0 for name in columns}
    arrow_schema = pa.schema([pa.field(c["name"], _arrow_type(c)) for c in schema])
    with _output(fs, data) as sink, pa.ipc.new_file(sink, arrow_schema) as writer:
        for start, stop in _chunks(columns, rows):
            arrays = []
            for c in schema:
                array, crcs[c["name"]] = _encode(c, columns[c["name"]][start:stop], crcs[c["name"]])
                arrays.append(array)
            writer.write_batch(pa.record_batch(arrays, schema=arrow_schema))
    for c in schema:
        c["crc32"] = crcs[c["name"]]
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
    _prune(fs, path, generation)
    return generation


def _schema(columns: Mapping[str, np.ndarray]) -> tuple[list[dict], int]:
    """The header's column list; refuses what would need pickle."""
    schema, rows = [], None
    for name, column in columns.items():
        if not isinstance(column, np.ndarray) or column.ndim < 1:
            raise SnapshotUnsupported(f"replay column {name!r} is not an array with a row axis")
        if rows is None:
            rows = column.shape[0]
        elif column.shape[0] != rows:
            raise SnapshotUnsupported(
                f"replay column {name!r} has {column.shape[0]} rows, not {rows}"
            )
        if column.dtype.hasobject:
            if column.ndim != 1:
                raise SnapshotUnsupported(
                    f"replay column {name!r} holds Python objects in shape {column.shape[1:]}; "
                    "a snapshot stores object columns only as one bytes object per row"
                )
            bad = next((x for x in column if x is not None and type(x) is not bytes), None)
            if bad is not None:
                raise SnapshotUnsupported(
                    f"replay column {name!r} holds {type(bad).__name__} objects; a snapshot "
                    "stores numbers (bool, int, uint, float) and bytes only (anything else would "
                    "need pickle): convert the column before adding it to the replay"
                )
            schema.append({"name": name, "dtype": BYTES, "shape": []})
        elif column.dtype.kind in _NUMERIC_KINDS:
            dtype = column.dtype.newbyteorder("=")
            schema.append({"name": name, "dtype": dtype.str, "shape": list(column.shape[1:])})
        else:
            raise SnapshotUnsupported(
                f"replay column {name!r} has dtype {column.dtype}; a snapshot stores numbers "
                "(bool, int, uint, float) and bytes only"
            )
    return schema, rows or 0


def _chunks(columns: Mapping[str, np.ndarray], rows: int) -> Iterator[tuple[int, int]]:
    """Row ranges of at most CHUNK_BYTES each (at least one row; one empty range for no rows)."""
    if rows == 0:
        yield 0, 0
        return
    fixed = sum(c[:1].nbytes for c in columns.values() if not c.dtype.hasobject)
    blobs = [c for c in columns.values() if c.dtype.hasobject]
    if not blobs:  # every row the same size
        step = max(1, CHUNK_BYTES // max(fixed, 1))
        for start in range(0, rows, step):
            yield start, min(start + step, rows)
        return
    ends = np.full(rows, fixed, dtype=np.int64)
    for column in blobs:
        ends += np.fromiter((0 if x is None else len(x) for x in column), np.int64, rows)
    np.cumsum(ends, out=ends)
    start = 0
    while start < rows:
        base = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + CHUNK_BYTES, side="right")))
        yield start, min(stop, rows)
        start = stop


def _arrow_type(column: Mapping[str, Any]):
    import pyarrow as pa

    if column["dtype"] == BYTES:
        return pa.large_binary()
    value = pa.from_numpy_dtype(np.dtype(column["dtype"]))
    if not column["shape"]:
        return value
    if 0 in column["shape"]:  # rows of no values: Arrow's tensors need at least one
        return pa.null()
    return pa.fixed_shape_tensor(value, column["shape"])


def _encode(column: Mapping[str, Any], values: np.ndarray, crc: int):
    """(Arrow array, running CRC) for one chunk of a column."""
    import pyarrow as pa

    if column["dtype"] == BYTES:
        if any(value is None for value in values):
            array = pa.array(values, type=pa.large_binary())
        else:  # one copy of the chunk's bytes (Arrow's builder would grow by doubling)
            offsets = np.zeros(len(values) + 1, dtype=np.int64)
            np.cumsum([len(value) for value in values], out=offsets[1:])
            data = pa.py_buffer(b"".join(values))
            array = pa.LargeBinaryArray.from_buffers(
                pa.large_binary(), len(values), [None, pa.py_buffer(offsets), data]
            )
        return array, _binary_crc(array, crc)
    values = np.ascontiguousarray(values, dtype=np.dtype(column["dtype"]))
    crc = zlib.crc32(values.view(np.uint8).reshape(-1) if values.size else b"", crc)
    if not column["shape"]:
        return pa.array(values), crc
    if 0 in column["shape"]:
        return pa.nulls(len(values)), crc
    flat = pa.array(values.reshape(-1))
    storage = pa.FixedSizeListArray.from_arrays(flat, int(np.prod(column["shape"])))
    return pa.ExtensionArray.from_storage(_arrow_type(column), storage), crc


def _binary_crc(array, crc: int) -> int:
    """CRC of a bytes column chunk: its null mask, the values' lengths, then their bytes."""
    n = len(array)
    if n == 0:
        return crc
    nulls = np.asarray(array.is_null(), dtype=np.uint8)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[array.offset : array.offset + n + 1]
    data = array.buffers()[2]
    crc = zlib.crc32(nulls, crc)
    crc = zlib.crc32(np.diff(offsets).astype("<i8"), crc)
    if data is not None and offsets[-1] > offsets[0]:
        crc = zlib.crc32(memoryview(data)[offsets[0] : offsets[-1]], crc)
    return crc


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


def _prune(fs, path: str, newest: int) -> None:
    """Keep ``newest`` and the newest complete generation before it; delete the rest."""
    found = _generations(fs, path)
    complete = sorted(g for g, kinds in found.items() if kinds == {"arrow", "json"} and g < newest)
    keep = {newest, *complete[-(KEEP - 1) :]} if KEEP > 1 else {newest}
    for generation, kinds in found.items():
        if generation not in keep and generation < newest:
            for suffix in kinds:
                fs.delete_file(_file(path, generation, suffix))


def _header_crc(header: Mapping[str, Any]) -> int:
    body = {k: v for k, v in header.items() if k != "header_crc32"}
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


# ---- reading ------------------------------------------------------------------------------------
def has_snapshot(uri: str) -> bool:
    """Whether the location ``uri`` holds a generation with a header (complete or not), or an
    earlier version's pickle."""
    if _legacy(uri) is not None:
        return True
    fs, path = _filesystem(uri)
    return any("json" in kinds for kinds in _generations(fs, path).values())


class Generation:
    """One numbered generation at a location; :meth:`read` loads and checks it."""

    def __init__(self, uri: str, fs, path: str, number: int) -> None:
        self.uri, self.number = uri, number
        self._fs, self._path = fs, path

    @property
    def name(self) -> str:
        """The header file, as the user would name it."""
        return _shown(_file(self._path, self.number, "json"), self.uri)

    def read(self) -> Snapshot:
        """The generation's content; :class:`ReplaySnapshotCorrupt` if it is damaged."""
        return _read_generation(self._fs, self._path, self.number, self.uri)


def generations(uri: str) -> list[Generation]:
    """The generations at the location ``uri`` that have a header, newest first (empty when
    there is none); :class:`LegacyPickleSnapshot` where only an earlier version's pickle is."""
    fs, path = _filesystem(uri)
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


def _read_generation(fs, path: str, generation: int, uri: str) -> Snapshot:
    header_file = _file(path, generation, "json")
    header = _read_header(fs, header_file, uri)
    data_file = _file(path, generation, "arrow")
    corrupt = _corrupt(data_file, uri)
    if header["generation"] != generation or header["data_file"] != data_file.rsplit("/", 1)[1]:
        raise corrupt("header", f"the header names generation {header['generation']}'s files")
    info = fs.get_file_info(data_file)
    if info.size is None or info.size < 0:
        raise corrupt("truncated", "the data file is missing")
    if info.size != header["data_bytes"]:
        raise corrupt("truncated", f"{info.size} bytes, the header says {header['data_bytes']}")
    columns = {c["name"]: c for c in header["columns"]}
    try:
        arrays = _read_columns(fs, data_file, header, columns, corrupt)
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
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
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
    for key, kind in (("generation", int), ("data_bytes", int), ("rows", int), ("state", dict)):
        if not isinstance(header[key], kind) or isinstance(header[key], bool):
            raise TypeError(f"{key} must be {kind.__name__}, got {header[key]!r}")
    if header["rows"] < 0:
        raise ValueError(f"rows must be >= 0, got {header['rows']}")
    names = set()
    for c in header["columns"]:
        if not isinstance(c["name"], str) or c["name"] in names:
            raise ValueError(f"column names must be distinct strings, got {c['name']!r}")
        names.add(c["name"])
        if not isinstance(c["crc32"], int):
            raise TypeError(f"column {c['name']!r} crc32 must be int")
        if c["dtype"] == BYTES:
            if c["shape"] != []:
                raise ValueError(f"bytes column {c['name']!r} must have shape []")
            continue
        if not isinstance(c["dtype"], str) or np.dtype(c["dtype"]).kind not in _NUMERIC_KINDS:
            raise ValueError(f"column {c['name']!r} has dtype {c['dtype']!r}")
        shape = c["shape"]
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ValueError(f"column {c['name']!r} has shape {shape!r}")


def _read_columns(fs, data_file: str, header, columns, corrupt) -> dict[str, np.ndarray]:
    import pyarrow as pa

    expected = pa.schema([pa.field(name, _arrow_type(c)) for name, c in columns.items()])
    source = pa.memory_map(data_file) if _is_local_fs(fs) else fs.open_input_file(data_file)
    with source, pa.ipc.open_file(source) as reader:
        if not reader.schema.equals(expected):
            raise corrupt("schema", f"the data's schema {reader.schema} is not the header's")
        rows = header["rows"]
        out = {
            name: np.empty((rows, *c["shape"]), dtype=object if c["dtype"] == BYTES else c["dtype"])
            for name, c in columns.items()
        }
        crcs = {name: 0 for name in columns}
        at = 0
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            # Arrow trusts the buffers' offsets and lengths it reads: check them all before any
            # value is touched (damaged offsets would read outside the file, or crash)
            batch.validate(full=True)
            n = batch.num_rows
            if at + n > rows:
                raise corrupt("schema", f"more than the header's {rows} rows")
            for name, c in columns.items():
                array = batch.column(name)
                if c["dtype"] == BYTES:
                    crcs[name] = _binary_crc(array, crcs[name])
                    out[name][at : at + n] = array.to_numpy(zero_copy_only=False)
                else:
                    if array.null_count and 0 not in c["shape"]:  # a damaged validity bitmap
                        raise corrupt("format", f"column {name!r} has null values")
                    values = _numeric(array, c, n)
                    crc_bytes = values.view(np.uint8).reshape(-1) if values.size else b""
                    crcs[name] = zlib.crc32(crc_bytes, crcs[name])
                    out[name][at : at + n] = values
            at += n
    if at != rows:
        raise corrupt("truncated", f"{at} rows, the header says {rows}")
    for name, c in columns.items():
        if crcs[name] != c["crc32"]:
            raise corrupt("checksum", f"column {name!r} does not match its checksum")
    return out


def _numeric(array, column: Mapping[str, Any], n: int) -> np.ndarray:
    dtype = np.dtype(column["dtype"])
    if not column["shape"]:
        return np.ascontiguousarray(array.to_numpy(zero_copy_only=False), dtype=dtype)
    if 0 in column["shape"]:
        return np.empty((n, *column["shape"]), dtype=dtype)
    flat = array.storage.flatten().to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(flat, dtype=dtype).reshape(n, *column["shape"])
