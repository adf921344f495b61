"""How many of an algorithm's env runners are up: reported every iteration, warned on change.

A lost node takes its env runners with it; RLlib restarts them when some node has room, and
until then the algorithm trains on the others. The results say so (``degraded``), and the log
says when the count of runners down changes, so that a run on a shrunken cluster is never
silent about it.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class RunnerHealth:
    """Counts ``num_env_runners`` against the healthy remote env runners.

    Args:
        algorithm: the algorithm's name, for the warning.
        num_env_runners: how many remote env runners the config asks for.
    """

    def __init__(self, algorithm: str, num_env_runners: int) -> None:
        self.algorithm = algorithm
        self.num_env_runners = num_env_runners
        self._down = 0

    def report(self, env_runner_group) -> dict[str, int]:
        """``num_healthy_env_runners``, ``num_env_runners_down`` and ``degraded`` (1 while some
        are down), with a warning when the number down changed since the last report."""
        healthy = env_runner_group.num_healthy_remote_workers()
        down = self.num_env_runners - healthy
        if down != self._down:
            if down > 0:
                log.warning(
                    "%s runs degraded: %d of %d env runners are down (restarting, or waiting "
                    "for resources to restart on); training goes on with the others",
                    self.algorithm,
                    down,
                    self.num_env_runners,
                )
            else:
                log.warning("all %d env runners are healthy again", self.num_env_runners)
            self._down = down
        return {
            "num_healthy_env_runners": healthy,
            "num_env_runners_down": down,
            "degraded": int(down > 0),
        }

    def none_up(self, report: dict[str, int]) -> bool:
        """Whether the config asks for remote runners and none of them is up."""
        return self.num_env_runners > 0 and report["num_healthy_env_runners"] == 0
