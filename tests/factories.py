from __future__ import annotations

from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from leaderboards.actions import RANK_HOOK
from leaderboards.models import Code, Leaderboard, Problem, Run, RunStatus, Submission
from runners.models import Gpu, GpuPool, GpuType, GpuVendor, Node
from taskspec.model import TaskDefinition


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")


def local_cpu_pool(name: str = "local") -> GpuPool:
    cpu, _ = GpuType.objects.get_or_create(name="CPU", defaults={"vendor": GpuVendor.CPU})
    pool = GpuPool.objects.create(name=name)
    node = Node.objects.create(pool=pool, hostname="localhost")
    Gpu.objects.create(node=node, gpu_type=cpu, index=0)
    pool.cpu = cpu
    return pool


def problem_from(task: TaskDefinition, harness: str = "kernelbot") -> Problem:
    return Problem.objects.create(name=task.name, content_hash=task.content_hash, lang=task.lang,
                                  description=task.description, definition=task.to_json(), harness=harness)


class LeaderboardFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Leaderboard
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"board-{n}")
    deadline = factory.LazyFunction(lambda: timezone.now() + timedelta(days=7))

    @factory.post_generation
    def gpu_types(self, create, extracted, **kwargs):
        if create and extracted:
            self.gpu_types.set(extracted)


def submission(leaderboard: Leaderboard, user=None, code: str = "def custom_kernel(data): ...",
               mode: str = "leaderboard", gpu_type: GpuType | None = None, created=None) -> Submission:
    code_row, _ = Code.objects.get_or_create(sha256=Code.digest(code), defaults={"text": code})
    sub = Submission.objects.create(user=user or UserFactory(), leaderboard=leaderboard,
                                    problem=leaderboard.problem, file_name="submission.py", code=code_row, mode=mode)
    if created:
        Submission.objects.filter(pk=sub.pk).update(created=created)
        sub.refresh_from_db()
    gpu_type = gpu_type or leaderboard.gpu_types.first()
    for secret in ([False, True] if mode == "leaderboard" else [False]):
        Run.objects.create(submission=sub, gpu_type=gpu_type, secret=secret, status=RunStatus.QUEUED,
                           status_deadline=Run.deadline_for(RunStatus.QUEUED),
                           on_finish=RANK_HOOK if mode == "leaderboard" else "")
    return sub


def ranked_result(means_ns: list[float], verdict: str = "pass") -> dict:
    timings = [{"spec": f"size: {i}", "status": "pass", "mean": m, "runs": 20} for i, m in enumerate(means_ns)]
    return {"event": "result", "status": "ok", "verdict": verdict, "passed": verdict == "pass",
            "tests": [], "benchmarks": timings, "ranked": timings, "system": {"device": "cpu"},
            "stdout": "", "stderr": "", "error": "" if verdict == "pass" else "wrong answer"}


def remote_pool(backend: str, gpu_type: GpuType, name: str | None = None, devices: int = 1,
                settings: dict | None = None) -> GpuPool:
    """A pool reached through a remote backend: one node standing for the service, `devices` of `gpu_type` on it
    (what `GpuPool.objects.serving` counts)."""
    pool = GpuPool.objects.create(name=name or f"{backend}-{GpuPool.objects.count() + 1}", backend=backend,
                                  settings=settings or {})
    node = Node.objects.create(pool=pool, hostname=f"{pool.name}.remote")
    for index in range(devices):
        Gpu.objects.create(node=node, gpu_type=gpu_type, index=index)
    return pool
