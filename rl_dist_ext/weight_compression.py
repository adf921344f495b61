"""Compressed weights for learner -> parameter server -> actors (optional; exact by default).

Gorila and Ape-X actors pull the learner's weights every K steps; with a pixel network (the
Nature CNN: 1.7M parameters, 6.7 MB as float32) those pulls are most of the parameter traffic.
Encodings, applied to every floating-point array or tensor in a weights tree (nested dicts,
lists, tuples; other leaves pass unchanged):

- ``"fp32"``: as they are (the default; exact).
- ``"fp16"``: half precision; each element's relative error is at most 2**-11 within fp16's
  normal range (|w| >= 2**-14; smaller values keep an absolute error of at most 2**-25).
- ``"int8"``: per-tensor symmetric quantisation, ``q = round(w / s)`` with ``s = max|w| / 127``;
  each element's absolute error is at most ``s / 2``.
- ``"delta"``: the learner publishes float32; the parameter server sends each actor the change
  since the version it holds, each element within a bound of the learner's
  (:mod:`rl_dist_ext.weight_deltas`).

The learner encodes once per publish (:func:`encode_weights`); each actor decodes what it pulls
(:func:`decode_weights`) and gets float32 back. ``benchmarks/weight_sync_bench.py`` measures
bytes, time and the effect on Q-values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from rl_dist_ext.validation import check_choice, is_torch_tensor

ENCODINGS = ("fp32", "fp16", "int8", "delta")


class Int8Tensor(NamedTuple):
    """One quantised tensor: ``values * scale`` restores it."""

    values: np.ndarray  # int8, the tensor's shape
    scale: float
    torch_tensor: bool  # restore as a torch tensor (else a numpy array)


class EncodedWeights(NamedTuple):
    encoding: str
    tree: Any  # the weights tree with its floating-point leaves encoded


def check_encoding(encoding: Any) -> str:
    return check_choice("weights_encoding", encoding, ENCODINGS)


def encode_weights(weights: Any, encoding: str) -> Any:
    """``weights`` as they travel to the server: unchanged for ``"fp32"`` and ``"delta"``,
    else :class:`EncodedWeights`."""
    check_encoding(encoding)
    if encoding in ("fp32", "delta"):  # delta: the server encodes per pull
        return weights
    encode = _to_fp16 if encoding == "fp16" else _to_int8
    return EncodedWeights(encoding, map_float_leaves(weights, encode))


def decode_weights(weights: Any) -> Any:
    """What :func:`encode_weights` produced, back to float32 (``"fp32"`` weights pass as they
    are)."""
    if not isinstance(weights, EncodedWeights):
        return weights
    if weights.encoding == "fp16":
        return map_float_leaves(weights.tree, _from_fp16)
    return map_leaves(weights.tree, _from_int8)


def is_float_leaf(leaf: Any) -> bool:
    """Whether a weights-tree leaf is a floating-point array or tensor (what encodings touch)."""
    if is_torch_tensor(leaf):
        return leaf.is_floating_point()
    return isinstance(leaf, np.ndarray) and leaf.dtype.kind == "f"


def map_float_leaves(tree: Any, fn: Callable[[Any], Any]) -> Any:
    """``tree`` with ``fn`` applied to its floating-point leaves (others unchanged)."""
    return map_leaves(tree, lambda leaf: fn(leaf) if is_float_leaf(leaf) else leaf)


def map_leaves(tree: Any, fn: Callable[[Any], Any]) -> Any:
    """``tree`` (nested dicts, lists, tuples, NamedTuples) with ``fn`` applied to every leaf, in
    the tree's order."""
    if isinstance(tree, dict):
        return type(tree)((k, map_leaves(v, fn)) for k, v in tree.items())
    if isinstance(tree, Int8Tensor):
        return fn(tree)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a NamedTuple
        return type(tree)(*(map_leaves(v, fn) for v in tree))
    if isinstance(tree, list | tuple):
        return type(tree)(map_leaves(v, fn) for v in tree)
    return fn(tree)


def _to_fp16(leaf: Any) -> Any:
    if is_torch_tensor(leaf):
        import torch

        return leaf.detach().to("cpu", torch.float16)
    return leaf.astype(np.float16)


def _from_fp16(leaf: Any) -> Any:
    if is_torch_tensor(leaf):
        import torch

        return leaf.to(torch.float32)
    return leaf.astype(np.float32)


def _to_int8(leaf: Any) -> Int8Tensor:
    is_torch = is_torch_tensor(leaf)
    array = leaf.detach().float().cpu().numpy() if is_torch else np.asarray(leaf)
    array = array.astype(np.float32, copy=False)
    peak = float(np.abs(array).max()) if array.size else 0.0
    scale = peak / 127.0 if peak > 0 else 1.0
    values = np.clip(np.rint(array / scale), -127, 127).astype(np.int8)
    return Int8Tensor(values, scale, is_torch)


def _from_int8(leaf: Any) -> Any:
    if not isinstance(leaf, Int8Tensor):
        return leaf
    restored = leaf.values.astype(np.float32) * np.float32(leaf.scale)
    if not leaf.torch_tensor:
        return restored
    import torch  # weights that were tensors go to a process that uses torch

    return torch.from_numpy(restored)
