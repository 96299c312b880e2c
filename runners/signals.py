"""Hooks from runners up to the app that owns runs (runners never imports leaderboards)."""

from django.dispatch import Signal

# A remote service said something changed for these external ids of `sender` (a GpuPool): poll them now.
# Sent with external_ids: list[str]. The lifecycle connects a receiver that enqueues a poll on commit.
remote_news = Signal()
