import json
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from runners.actions import NodeRejected, do_register_node, probe_this_machine
from runners.models import GpuPool, GpuType
from runners.pools import containment


class Command(BaseCommand):
    help = ("Create or update a node of a GPU pool and its device rows from what the node really has: this machine's "
            "probe, or a report from `python -m runners.harness.probe` run on the node (--probe-file). A GPU type "
            "that the node's devices contradict is refused and nothing is written.")

    def add_arguments(self, parser):
        parser.add_argument("pool", help="The pool's name.")
        parser.add_argument("--hostname", default="", help="The node's name in the pool (default: the probe's).")
        parser.add_argument("--gpu-type", default="", help="What the devices are, e.g. L4 (checked against the "
                            "probe); default: recognised from each device's name.")
        parser.add_argument("--probe-file", default="", help="The node's probe report (JSON; - for stdin).")

    def handle(self, *, pool, hostname, gpu_type, probe_file, **options):
        found = GpuPool.objects.filter(name=pool).first()
        if found is None:
            raise CommandError(f"no GPU pool named '{pool}' (pools: "
                               f"{', '.join(GpuPool.objects.values_list('name', flat=True)) or 'none'})")
        claimed = None
        if gpu_type:
            claimed = GpuType.objects.filter(name__iexact=gpu_type).first()
            if claimed is None:
                raise CommandError(f"no GPU type named '{gpu_type}'; add it in the admin (GPU types) first")
        try:
            report = self.report(probe_file)
            done = do_register_node(found, report, hostname=hostname, gpu_type=claimed)
        except NodeRejected as exc:
            raise CommandError(f"refused: {exc}") from exc
        self.stdout.write(f"{done.node.hostname} in pool {found.name}: {len(done.created)} devices added, "
                          f"{len(done.updated)} updated, {len(done.disabled)} no longer found and disabled")
        for gpu in done.created + done.updated:
            self.stdout.write(f"  #{gpu.index} {gpu.gpu_type}: {gpu.device_name} {gpu.uuid}".rstrip())
        memory = containment(done.node.hostname, done.node.sandbox)
        if memory.problem or memory.warning:
            self.stdout.write(self.style.WARNING(f"  memory: {memory.summary}"))
        else:
            self.stdout.write(f"  memory: {memory.summary}")

    @staticmethod
    def report(probe_file: str) -> dict:
        if not probe_file:
            return probe_this_machine()
        try:
            report = json.loads(sys.stdin.read() if probe_file == "-" else Path(probe_file).read_text())
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot read the probe report {probe_file}: {exc}") from exc
        if not isinstance(report, dict) or not isinstance(report.get("devices"), list):
            raise CommandError(f"{probe_file} is not a probe report (`python -m runners.harness.probe` on the node "
                               "writes one)")
        return report
