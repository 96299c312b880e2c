import socket

from django.core.management.base import BaseCommand, CommandError

from runners.backends.base import runner_key
from runners.harness.node import NODE_TOKEN_ENV, node_token
from runners.models import GpuPool


class Command(BaseCommand):
    help = (f"Print the token a machine's node agent authenticates with ({NODE_TOKEN_ENV} in its environment): it "
            "opens that node's routes of that pool only, so the machine never holds the platform's runner key.")

    def add_arguments(self, parser):
        parser.add_argument("pool", help="The local pool the machine belongs to (the agent's --pool).")
        parser.add_argument("--hostname", default=socket.gethostname(),
                            help="The machine's name in the pool (the agent's --hostname; default: this machine's).")

    def handle(self, *, pool, hostname, **options):
        found = GpuPool.objects.filter(name=pool).first()
        if found is None or not found.is_local:
            raise CommandError(f"no pool {pool!r} runs on node agents (manage.py add_pool {pool} creates one)")
        if not (key := runner_key(found)):
            raise CommandError("no runner key is set (KERNELBOT_RUNNER_KEY, or the pool's runner_key_env)")
        self.stdout.write(node_token(key, pool, hostname))
