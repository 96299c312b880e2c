from __future__ import annotations

import pytest

from runners.models import Gpu, GpuPool, GpuType, GpuVendor, Node
from runners.reservations.models import PoolPolicy
from tests import factories


def gpu_pool(name: str = "lab", nodes: int = 2, per_node: int = 8, gpu: str = "H100", **policy) -> GpuPool:
    gpu_type, _ = GpuType.objects.get_or_create(name=gpu, defaults={"vendor": GpuVendor.NVIDIA})
    pool = GpuPool.objects.create(name=name)
    for n in range(nodes):
        node = Node.objects.create(pool=pool, hostname=f"{name}-node{n}")
        Gpu.objects.bulk_create(Gpu(node=node, gpu_type=gpu_type, index=i) for i in range(per_node))
    PoolPolicy.objects.create(pool=pool, **{"competition_share": 0, **policy})
    pool.gpu_type = gpu_type
    return pool


@pytest.fixture
def user(db):
    return factories.UserFactory(username="dev")


@pytest.fixture
def other(db):
    return factories.UserFactory(username="other")
