"""What `kernelbot run` downloads to run a leaderboard's task on a competitor's own machine: the task's files and,
per local mode, the harness job the platform builds (`taskspec.jobspec`, the one builder both use) with the public
seed only, and the version of the harness tarball remote runners fetch. The secret seed and each run's own seed
never leave the server. Who may fetch it is who may see the leaderboard (`access.authority`)."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.urls import reverse

from taskspec import jobspec

from .models import Leaderboard
from .runner_api import harness_tarball


@cache
def harness_version() -> str:
    return jobspec.tarball_digest(harness_tarball())


def local_task(leaderboard: Leaderboard) -> dict[str, Any]:
    problem = leaderboard.problem
    return {"leaderboard": leaderboard.name,
            "problem": {"name": problem.name, "version": problem.version, "content_hash": problem.content_hash},
            "harness": {"url": reverse("runner-harness"), "version": harness_version()},
            **jobspec.public_bundle(problem.definition, protocol=problem.harness, ranking_by=leaderboard.ranking_by,
                                    timing=settings.HARNESS_TIMING)}
