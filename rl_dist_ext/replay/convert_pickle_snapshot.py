"""Convert replay snapshots that rl-dist-ext 0.x wrote as pickles into the current format.

Unpickling a file runs whatever code it names, so the replay never does it on its own: it
refuses those files (:class:`~rl_dist_ext.replay.snapshot.LegacyPickleSnapshot`) and points
here. Run this only on files you trust (ones your own runs wrote, on storage only you write)::

    python -m rl_dist_ext.replay.convert_pickle_snapshot PATH [PATH ...]

``PATH`` is one old snapshot file (``.../shard_0.pkl``, converted to the location
``.../shard_0/``; a file named otherwise needs ``--to NEW_LOCATION``, which the shard's
``snapshot_uri`` then names), or a directory or URI holding them (a checkpoint, or a
``snapshot_dir``): every ``shard_<i>.pkl`` in it is converted. The pickles stay where they
are; once converted, a restore reads the new snapshots and ignores them.
"""

from __future__ import annotations

import argparse
import pickle
import re
import sys

from rl_dist_ext.replay import snapshot
from rl_dist_ext.replay.prioritized import PrioritizedReplay

_SHARD_PICKLE = re.compile(r"^shard_\d+\.pkl$")


def convert_file(uri: str, to: str | None = None) -> str:
    """Convert the pickle at ``uri``; returns the new location: ``to``, or ``uri`` without its
    ``.pkl`` (a pickle named otherwise needs ``to``, and the shard's ``snapshot_uri`` then
    names ``to``)."""
    base, mark, query = uri.partition("?") if "://" in uri else (uri, "", "")
    if to is None:
        if not base.endswith(".pkl"):
            raise ValueError(
                f"{uri!r} does not end in .pkl: name the new snapshot location (--to), and "
                "point the shard's snapshot_uri there"
            )
        to = f"{base.removesuffix('.pkl')}{mark}{query}"
    fs, path = snapshot.filesystem(uri)
    with fs.open_input_stream(path) as stream:
        state = pickle.loads(stream.read())  # the user vouched for this file
    saved = state["replay"]
    replay = PrioritizedReplay(
        saved["capacity"], alpha=saved["alpha"], eps=saved["eps"], compression=saved["compression"]
    )
    replay.load_state_dict(saved)
    replay_state, columns = replay.snapshot()
    snapshot.write_snapshot(to, {"replay": replay_state}, columns)
    return to


def convert(uri: str, to: str | None = None) -> list[str]:
    """Convert ``uri`` (one pickle, to ``to`` if given, or a directory of ``shard_<i>.pkl``);
    the new locations."""
    import pyarrow.fs as pafs

    fs, path = snapshot.filesystem(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return [convert_file(uri, to)]
    if to is not None:
        raise ValueError("--to names the location of one converted file, not of a directory's")
    if info.type != pafs.FileType.Directory:
        raise FileNotFoundError(f"no snapshot file or directory at {uri!r}")
    names = sorted(
        entry.base_name
        for entry in fs.get_file_info(pafs.FileSelector(path))
        if entry.type == pafs.FileType.File and _SHARD_PICKLE.match(entry.base_name)
    )
    if not names:
        raise FileNotFoundError(f"no shard_<i>.pkl snapshot in {uri!r}")
    return [convert_file(snapshot.join(uri, name)) for name in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rl_dist_ext.replay.convert_pickle_snapshot",
        description=__doc__.split("\n\n")[0]
        + " Unpickling runs code: convert only files you trust.",
    )
    parser.add_argument("paths", nargs="+", help="old snapshot files, or directories of them")
    parser.add_argument("--to", help="the new location of a single file not named *.pkl")
    args = parser.parse_args(argv)
    if args.to is not None and len(args.paths) != 1:
        parser.error("--to takes one path")
    for uri in args.paths:
        try:
            locations = convert(uri, args.to)
        except (ValueError, FileNotFoundError) as error:
            parser.error(str(error))
        for location in locations:
            print(f"converted -> {location}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
