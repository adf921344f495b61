"""Where an example's Ray runs: on this machine (the default) or on a cluster it joins.

``--address auto`` joins the cluster this machine is a node of (``ray start --head`` here, or
``ray start --address=<head>:6379`` to add this machine to one); ``--address ray://<head>:10001``
connects through Ray Client (e.g. to a KubeRay cluster's head service). On a cluster of several
machines, replay snapshots and checkpoints must go to storage every node reaches (``--out`` and
``snapshot_dir`` as an ``s3://``/``gs://`` URI or a shared mount): see docs/clusters.md.
"""

from __future__ import annotations

import argparse
import os


def add_address_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        default=None,
        help="join an existing Ray cluster ('auto', or 'ray://<head>:10001'); "
        "default: start Ray on this machine",
    )


def start_ray(address: str | None) -> None:
    """``ray.init`` on this machine with all its cores, or joining the cluster at ``address``."""
    import ray

    if address is None:
        ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False)
    else:
        ray.init(address=address)
