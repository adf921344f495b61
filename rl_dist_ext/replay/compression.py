"""Compressed observation columns for the replay: one codec-compressed blob per stored row.

Pixel observations dominate a transition's size: an 84x84x4 uint8 stack is 28 KB, and ``obs`` and
``next_obs`` together 56 KB. :class:`ObsCompression` names the columns to compress; for each row,
those columns' bytes are concatenated (``obs`` then ``next_obs``) and compressed as one blob with a
fast codec (LZ4 or zstd). Compressing the concatenation is also the frame de-duplication: the
frames ``next_obs`` shares with ``obs`` (3 of 4 for 1-step transitions) lie within the codec's
window and are stored as back-references, a few bytes each. Because each row is its own blob,
nothing depends on other rows: episode boundaries, ring-buffer overwrites, checkpoints and shard
restarts need no bookkeeping beyond the row itself.

Measured on Pong frames (``benchmarks/pixel_replay_bench.py``): a 56 KB ``obs``+``next_obs`` row
becomes a few hundred bytes. Actors compress (:func:`pack`, in
:meth:`~rl_dist_ext.replay.distributed.DistributedReplay.add`, so the actor -> shard path carries
blobs); shards decompress when sampling (:func:`unpack`), off the learner's critical path, and the
learner receives the original arrays, dtypes unchanged.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from rl_dist_ext.validation import check_choice

#: the replay column that holds the compressed blobs (user columns may not use this name)
BLOB_COLUMN = "_compressed"

_CODEC_PACKAGES = {"lz4": "lz4.block", "zstd": "zstandard"}


class ColumnLayout(NamedTuple):
    """Where one compressed column lives in a row's decompressed bytes."""

    name: str
    shape: tuple[int, ...]  # per-row shape
    dtype: str  # numpy dtype string, e.g. "|u1"


class PackedRows(NamedTuple):
    """Rows whose :class:`ObsCompression` columns were compressed by :func:`pack`."""

    columns: dict[str, np.ndarray]  # the uncompressed columns, [B, ...]
    blobs: np.ndarray  # [B] object array of bytes, one compressed blob per row
    layout: tuple[ColumnLayout, ...]
    codec: str

    def __len__(self) -> int:
        return int(self.blobs.shape[0])


@dataclass(frozen=True, kw_only=True)
class ObsCompression:
    """Which replay columns to compress, and with what.

    Args:
        columns: the columns compressed together into one blob per row (pixel observations:
            ``("obs", "next_obs")``); the other columns are stored as they are.
        codec: ``"lz4"`` (the fastest; the ``lz4`` package) or ``"zstd"`` (smaller blobs at a
            similar speed; the ``zstandard`` package). Both come with the ``pixels`` extra.
        level: the codec's compression level (``None``: lz4's fast mode, zstd level 1).
    """

    columns: tuple[str, ...] = ("obs", "next_obs")
    codec: str = "lz4"
    level: int | None = None

    def __post_init__(self) -> None:
        if (
            not isinstance(self.columns, tuple)
            or not self.columns
            or not all(isinstance(c, str) and c for c in self.columns)
            or len(set(self.columns)) != len(self.columns)
        ):
            raise ValueError(
                f"ObsCompression.columns must be a non-empty tuple of distinct column names, "
                f"got {self.columns!r}"
            )
        if BLOB_COLUMN in self.columns:
            raise ValueError(f"ObsCompression.columns may not include {BLOB_COLUMN!r}")
        check_choice("ObsCompression.codec", self.codec, sorted(_CODEC_PACKAGES))
        if self.level is not None and (
            isinstance(self.level, bool) or not isinstance(self.level, int)
        ):
            raise TypeError(f"ObsCompression.level must be an int or None, got {self.level!r}")
        codec_module(self.codec)  # a missing package fails here, before any actor starts


def codec_module(codec: str) -> Any:
    """The module that implements ``codec``; ``ImportError`` saying what to install if absent."""
    package = _CODEC_PACKAGES[codec]
    try:
        return importlib.import_module(package)
    except ImportError as error:
        raise ImportError(
            f"ObsCompression(codec={codec!r}) needs the {package.split('.')[0]!r} package: "
            "pip install 'rl-dist-ext[pixels]'"
        ) from error


class _Codec:
    """Compress/decompress callables for one (codec, level); zstd contexts are per process."""

    _cache: dict[tuple[str, int | None], _Codec] = {}

    def __init__(self, codec: str, level: int | None) -> None:
        module = codec_module(codec)
        if codec == "lz4":
            if level is None:
                self.compress = lambda data: module.compress(data, store_size=True)
            else:
                self.compress = lambda data: module.compress(
                    data, mode="high_compression", compression=level, store_size=True
                )
            self.decompress = module.decompress
        else:
            compressor = module.ZstdCompressor(level=1 if level is None else level)
            decompressor = module.ZstdDecompressor()
            self.compress = compressor.compress
            self.decompress = decompressor.decompress

    @classmethod
    def get(cls, codec: str, level: int | None) -> _Codec:
        key = (codec, level)
        if key not in cls._cache:
            cls._cache[key] = _Codec(codec, level)
        return cls._cache[key]


def pack(batch: dict[str, np.ndarray], compression: ObsCompression) -> PackedRows:
    """Compress ``compression.columns`` of ``batch`` (column -> ``[B, ...]``) row by row."""
    missing = [c for c in compression.columns if c not in batch]
    if missing:
        raise ValueError(
            f"ObsCompression.columns {list(compression.columns)} are not all in the batch: "
            f"missing {missing}, the batch has {sorted(batch)}"
        )
    if BLOB_COLUMN in batch:
        raise ValueError(f"batch column {BLOB_COLUMN!r} is reserved for compressed rows")
    arrays = [np.ascontiguousarray(batch[c]) for c in compression.columns]
    rows = arrays[0].shape[0] if arrays[0].ndim else 0
    for name, array in zip(compression.columns, arrays, strict=True):
        if array.ndim < 1 or array.shape[0] != rows:
            raise ValueError(
                f"batch[{name!r}] must have {rows} rows like batch[{compression.columns[0]!r}], "
                f"got shape {array.shape}"
            )
        if array.dtype.hasobject:
            raise TypeError(f"batch[{name!r}] has dtype object, which cannot be compressed")
    layout = tuple(
        ColumnLayout(name, tuple(a.shape[1:]), a.dtype.str)
        for name, a in zip(compression.columns, arrays, strict=True)
    )
    flat = np.concatenate([a.reshape(rows, -1).view(np.uint8) for a in arrays], axis=1)
    compress = _Codec.get(compression.codec, compression.level).compress
    blobs = np.empty(rows, dtype=object)
    for i in range(rows):
        # A copy of exactly its size: the codecs shrink a worst-case-sized buffer in place,
        # which keeps most of that buffer's memory pinned for as long as the blob is stored.
        blobs[i] = bytes(memoryview(compress(flat[i])))
    columns = {k: v for k, v in batch.items() if k not in compression.columns}
    return PackedRows(columns, blobs, layout, compression.codec)


def unpack(blobs: np.ndarray, layout: tuple[ColumnLayout, ...], codec: str) -> dict[str, Any]:
    """The arrays :func:`pack` compressed: column -> ``[B, *shape]`` of its original dtype."""
    decompress = _Codec.get(codec, None).decompress
    row_bytes = layout_row_bytes(layout)
    rows = blobs.shape[0]
    flat = np.empty((rows, row_bytes), dtype=np.uint8)
    for i in range(rows):
        flat[i] = np.frombuffer(decompress(blobs[i]), dtype=np.uint8)
    out: dict[str, np.ndarray] = {}
    offset = 0
    for column in layout:
        size = _column_bytes(column)
        part = np.ascontiguousarray(flat[:, offset : offset + size])
        out[column.name] = part.view(np.dtype(column.dtype)).reshape(rows, *column.shape)
        offset += size
    return out


def layout_row_bytes(layout: tuple[ColumnLayout, ...]) -> int:
    """Uncompressed bytes of one row's compressed columns."""
    return sum(_column_bytes(c) for c in layout)


def _column_bytes(column: ColumnLayout) -> int:
    return int(np.prod(column.shape, dtype=np.int64)) * np.dtype(column.dtype).itemsize
