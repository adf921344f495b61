"""The rows of a replay snapshot as Arrow columns: which columns the format holds (numbers and
bytes; nothing that would need pickle), their Arrow types, record batches of bounded size, and
the CRC-32 of each column, computed the same way when written and when read back.

Numeric columns with rows of one value are Arrow primitives; rows of several values are
``arrow.fixed_shape_tensor`` (rows of no values: Arrow nulls); bytes objects (compressed
observations) are ``large_binary``. A column's CRC covers its values' bytes (bytes columns: the
null mask, the lengths, then the bytes), chunk after chunk, in row order.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

#: Most bytes of rows one record batch holds while a snapshot is written.
CHUNK_BYTES = 16 * 2**20
NUMERIC_KINDS = "biuf"  # bool, signed and unsigned integers, floats
BYTES = "bytes"  # the header's dtype of a column of bytes objects (compressed observations)


class SnapshotUnsupported(TypeError):
    """A replay column the snapshot format cannot hold (it would need pickle)."""


def column_schema(columns: Mapping[str, np.ndarray]) -> tuple[list[dict], int]:
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
        elif column.dtype.kind in NUMERIC_KINDS:
            dtype = column.dtype.newbyteorder("=")
            schema.append({"name": name, "dtype": dtype.str, "shape": list(column.shape[1:])})
        else:
            raise SnapshotUnsupported(
                f"replay column {name!r} has dtype {column.dtype}; a snapshot stores numbers "
                "(bool, int, uint, float) and bytes only"
            )
    return schema, rows or 0


def _chunks(
    columns: Mapping[str, np.ndarray], rows: int, chunk_bytes: int
) -> Iterator[tuple[int, int]]:
    """Row ranges of at most ``chunk_bytes`` each (at least one row; one empty range for none)."""
    if rows == 0:
        yield 0, 0
        return
    fixed = sum(c[:1].nbytes for c in columns.values() if not c.dtype.hasobject)
    blobs = [c for c in columns.values() if c.dtype.hasobject]
    if not blobs:  # every row the same size
        step = max(1, chunk_bytes // max(fixed, 1))
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
        stop = max(start + 1, int(np.searchsorted(ends, base + chunk_bytes, side="right")))
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


def min_data_bytes(schema: list[dict], rows: int) -> int:
    """The fewest bytes an uncompressed Arrow file of ``rows`` rows of ``schema`` takes (numbers
    at their size, bools as bits, 8 bytes of offsets per bytes value): a header that claims more
    rows than its file could hold is refused before anything is allocated for them."""
    bits = 0
    for column in schema:
        if column["dtype"] == BYTES:
            bits += 64
        else:
            values = int(np.prod(column["shape"], dtype=np.int64))
            dtype = np.dtype(column["dtype"])
            bits += values * (1 if dtype.kind == "b" else 8 * dtype.itemsize)
    return rows * bits // 8


def read_columns(
    source, schema: list[dict], rows: int, data_bytes: int, corrupt
) -> dict[str, np.ndarray]:
    """The columns of the Arrow IPC file ``source`` (``data_bytes`` long), checked against the
    header's ``schema``, ``rows`` and CRCs; ``corrupt(reason, detail)`` makes the error raised
    when they differ. Batches whose buffers add up to more than the file (compressed, which a
    snapshot never is, or crafted) are refused."""
    import pyarrow as pa

    columns = {c["name"]: c for c in schema}
    expected = pa.schema([pa.field(name, _arrow_type(c)) for name, c in columns.items()])
    with pa.ipc.open_file(source) as reader:
        if not reader.schema.equals(expected):
            raise corrupt("schema", f"the data's schema {reader.schema} is not the header's")
        out = {
            name: np.empty((rows, *c["shape"]), dtype=object if c["dtype"] == BYTES else c["dtype"])
            for name, c in columns.items()
        }
        crcs = {name: 0 for name in columns}
        at = held = 0
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            held += batch.nbytes
            if held > data_bytes:
                raise corrupt("format", f"its batches hold more than the file's {data_bytes} bytes")
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


def write_columns(
    sink, schema: list[dict], columns: Mapping[str, np.ndarray], rows: int, chunk_bytes: int
) -> None:
    """Write ``columns`` to ``sink`` as an Arrow IPC file in record batches of at most
    ``chunk_bytes``; sets each ``schema`` entry's ``crc32``."""
    import pyarrow as pa

    crcs = {c["name"]: 0 for c in schema}
    arrow_schema = pa.schema([pa.field(c["name"], _arrow_type(c)) for c in schema])
    with pa.ipc.new_file(sink, arrow_schema) as writer:
        for start, stop in _chunks(columns, rows, chunk_bytes):
            arrays = []
            for c in schema:
                array, crcs[c["name"]] = _encode(c, columns[c["name"]][start:stop], crcs[c["name"]])
                arrays.append(array)
            writer.write_batch(pa.record_batch(arrays, schema=arrow_schema))
    for c in schema:
        c["crc32"] = crcs[c["name"]]


def check_header_column(column: Mapping[str, Any], names: set[str]) -> None:
    """``TypeError``/``ValueError`` unless ``column`` is a well-formed header entry whose name is
    not in ``names`` (which it joins)."""
    if not isinstance(column["name"], str) or column["name"] in names:
        raise ValueError(f"column names must be distinct strings, got {column['name']!r}")
    names.add(column["name"])
    if not isinstance(column["crc32"], int):
        raise TypeError(f"column {column['name']!r} crc32 must be int")
    if column["dtype"] == BYTES:
        if column["shape"] != []:
            raise ValueError(f"bytes column {column['name']!r} must have shape []")
        return
    if not isinstance(column["dtype"], str) or np.dtype(column["dtype"]).kind not in NUMERIC_KINDS:
        raise ValueError(f"column {column['name']!r} has dtype {column['dtype']!r}")
    shape = column["shape"]
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ValueError(f"column {column['name']!r} has shape {shape!r}")
