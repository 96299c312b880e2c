import socket

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from runners.models import Gpu, GpuPool, GpuType, GpuVendor, Node, RunnerBackendName


class Command(BaseCommand):
    help = "Create the CPU GPU type, a local pool with this machine's CPU as its one device, and the demo problems."

    def handle(self, **options):
        cpu, _ = GpuType.objects.get_or_create(name="CPU", defaults={"vendor": GpuVendor.CPU,
                                                                    "architecture": "x86_64"})
        pool, _ = GpuPool.objects.get_or_create(name="local", defaults={"backend": RunnerBackendName.LOCAL})
        node, _ = Node.objects.get_or_create(pool=pool, hostname=socket.gethostname())
        Gpu.objects.get_or_create(node=node, index=0, defaults={"gpu_type": cpu})
        call_command("import_problems", str(settings.PROBLEMS_DIR / "demo.yaml"), stdout=self.stdout)
