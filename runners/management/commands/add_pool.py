from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from runners.models import GpuPool, GpuType, GpuVendor, RunnerBackendName


class Command(BaseCommand):
    help = ("Create a GPU pool and the GPU types its machines have, for a first install from the command line (the "
            "admin's GPU pools and GPU types pages do the same). A local pool's devices are not typed here: each "
            "machine's node agent registers what its probe finds, recognising each device by a GPU type's name.")

    def add_arguments(self, parser):
        parser.add_argument("name", help="The pool's name, e.g. lab (what agents pass as --pool).")
        parser.add_argument("--backend", default=RunnerBackendName.LOCAL, choices=RunnerBackendName.values)
        parser.add_argument("--gpu-type", action="append", default=[], metavar="NAME[:VENDOR]",
                            help="A GPU type to create if missing, e.g. H100, MI300:amd, CPU (vendor cpu); repeatable.")

    def handle(self, *, name, backend, gpu_type, **options):
        vendors = dict(GpuVendor.choices)
        with transaction.atomic():
            for spec in gpu_type:
                type_name, _, vendor = spec.partition(":")
                vendor = vendor or (GpuVendor.CPU if type_name.upper() == "CPU" else GpuVendor.NVIDIA)
                if vendor not in vendors or not type_name.strip():
                    raise CommandError(f"--gpu-type {spec!r}: NAME[:VENDOR], vendor one of {', '.join(vendors)}")
                found, created = GpuType.objects.get_or_create(name=type_name.strip(), defaults={"vendor": vendor})
                self.stdout.write(f"GPU type {found.name} ({found.get_vendor_display()}) "
                                  f"{'created' if created else 'exists'}")
            pool, created = GpuPool.objects.get_or_create(name=name, defaults={"backend": backend})
        if not created and pool.backend != backend:
            raise CommandError(f"pool {name} exists and runs on {pool.get_backend_display()}")
        self.stdout.write(f"pool {name} {'created' if created else 'exists'} ({pool.get_backend_display()})")
        if pool.is_local:
            self.stdout.write(f"next: on each machine, KERNELBOT_NODE_TOKEN=$(manage.py node_token {name} --hostname "
                              f"HOST) python -m runners.harness.node --platform URL --pool {name}")
