import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the superuser 'admin' with a random password, printed once, unless a superuser exists."

    def handle(self, **options):
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("A superuser already exists (reset with: manage.py changepassword admin).")
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser("admin", "admin@localhost", password)
        self.stdout.write(self.style.SUCCESS(f"Created superuser 'admin' with password: {password}"))
        self.stdout.write("This password is shown only once.")
