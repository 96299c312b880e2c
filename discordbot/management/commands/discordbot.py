from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from discordbot.bot import run


class Command(BaseCommand):
    help = ("Run the Discord bot (its own process: a bot stuck on Discord never stalls the web or the workers). "
            "Needs DISCORD_TOKEN; the guilds, channels and organiser roles are set in the admin (Discord → Guilds).")

    def handle(self, **options):
        if not settings.DISCORD_TOKEN:
            raise CommandError("Set DISCORD_TOKEN to the bot's token (Developer Portal → your application → Bot).")
        run(settings.DISCORD_TOKEN)
