"""Checkpoints of the whole distributed replay: every shard's snapshot plus a manifest.

A checkpoint at ``path`` is ``path/manifest.json`` and one snapshot location per shard,
``path/shard_<i>/`` (see :mod:`rl_dist_ext.replay.snapshot`).

``save`` writes each shard as it is when the request reaches it (actors may go on inserting
meanwhile); the manifest records the config and each shard's saved size and insert count.
``restore`` checks the manifest against the running replay's shard count, capacity, alpha, eps and
compression before any shard loads. A shard that is restarting is asked again until ``timeout_s``.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from rl_dist_ext.replay import snapshot
from rl_dist_ext.replay.distributed.config import DistributedReplayConfig
from rl_dist_ext.replay.distributed.shards import ShardSet
from rl_dist_ext.replay.shard import ShardStatus

MANIFEST = "manifest.json"
MUST_MATCH = ("num_shards", "capacity", "alpha", "eps")


def shard_file(path: str, shard: int) -> str:
    return snapshot.join(path, f"shard_{shard}")


def save(shards: ShardSet, path: str) -> None:
    """Write every shard and the manifest under ``path`` (dir or URI); the caller flushes its
    adds and priority updates first."""
    statuses: list[ShardStatus] = shards.on_every_shard(
        "save", lambda i, h: h.save.remote(shard_file(path, i))
    )
    manifest = {k: v for k, v in asdict(shards.config).items() if k != "placement_group"}
    manifest["size_per_shard"] = [status.size for status in statuses]
    manifest["num_inserted_per_shard"] = [status.num_inserted for status in statuses]
    # the generations this save wrote: a restore reads exactly those (a later save into the
    # same path that failed half-way left newer generations of some shards only)
    manifest["generation_per_shard"] = [status.saved_generation for status in statuses]
    snapshot.write_text(snapshot.join(path, MANIFEST), json.dumps(manifest, indent=2))


def check_manifest(config: DistributedReplayConfig, path: str) -> list[int | None]:
    """Raise unless ``path`` holds a checkpoint this replay can load; returns the generation
    of each shard's snapshot it names (``None``: the newest, for manifests that name none)."""
    uri = snapshot.join(path, MANIFEST)
    try:
        text = snapshot.read_text(uri)
        if text is None:
            raise FileNotFoundError(f"no distributed replay checkpoint at {path!r}")
        manifest = json.loads(text)
        if not isinstance(manifest, dict) or not all(name in manifest for name in MUST_MATCH):
            raise ValueError(f"it must be a JSON object with the keys {list(MUST_MATCH)}")
    except (UnicodeDecodeError, ValueError) as error:  # JSONDecodeError is a ValueError
        raise snapshot.ReplaySnapshotCorrupt(
            uri, "header", f"not a checkpoint manifest: {error}"
        ) from None
    for name in MUST_MATCH:
        if manifest[name] != getattr(config, name):
            raise ValueError(
                f"checkpoint at {path!r} has {name}={manifest[name]!r}, this replay has "
                f"{name}={getattr(config, name)!r}"
            )
    # JSON turned the ObsCompression into a dict (its tuple into a list): compare that way
    mine = json.loads(json.dumps(asdict(config)["compression"]))
    if manifest.get("compression") != mine:
        raise ValueError(
            f"checkpoint at {path!r} has compression={manifest.get('compression')!r}, this "
            f"replay has compression={mine!r} (rows cannot be re-encoded on restore)"
        )
    pinned = manifest.get("generation_per_shard")
    if pinned is None:  # written before manifests named them
        return [None] * config.num_shards
    if not (
        isinstance(pinned, list)
        and len(pinned) == config.num_shards
        and all(type(g) is int and g >= 1 for g in pinned)
    ):
        raise snapshot.ReplaySnapshotCorrupt(
            uri, "header", f"generation_per_shard={pinned!r} is not one generation per shard"
        )
    return pinned
