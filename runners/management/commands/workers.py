from django.core.management.base import BaseCommand

from runners.supervisor import Supervisor


class Command(BaseCommand):
    help = ("Run this machine's django-q2 worker cluster (`qcluster`) under a supervisor that restarts it when it "
            "dies or stops making progress while runs wait, re-sends the queued runs' messages after a restart, "
            "reaps overdue runs every few seconds and stops the whole cluster within seconds on SIGTERM.")

    def handle(self, **options):
        Supervisor().run()
