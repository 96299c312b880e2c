"""200 submissions arriving as Discord interactions within a few seconds, through the loopback fake of Discord
(tests/fakes/discord.py) and the unmodified bot, on PostgreSQL + Redis:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/kernelbot_discordbench REDIS_URL=redis://127.0.0.1:6379/0 \\
        python bench/discord.py [--submissions 200 --spread 2]

Prints p95 time to the first answer (the acknowledgement; target ≤ 300 ms; Discord allows 3 s) and to the
submission's status in that answer; p95 from a run's state change (every run cancelled at once, as an organiser
would, from another process; the events cross the Redis layer like a worker's) to the edited status message
(target ≤ 1 s); interactions dropped and rate-limit (429) answers to the bot's edits. No worker runs: the figures
are the bot's, not the harness's."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# this file's own directory first on sys.path would make `import discord` import this file
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
os.environ.setdefault("DEBUG", "1")
os.environ.update({"DJANGO_SETTINGS_MODULE": "kernelbot.settings", "LOG_LEVEL": "WARNING",
                   "KERNELBOT_QUOTA_RANKED": "0/3600", "KERNELBOT_QUOTA_TEST": "0/3600"})

import django  # noqa: E402

django.setup()
import discord  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from discordbot.bot import point_at  # noqa: E402
from discordbot.models import Guild, StatusMessage  # noqa: E402
from leaderboards.actions import do_cancel_run  # noqa: E402
from leaderboards.models import Run, Submission  # noqa: E402
from taskspec.loader import load_task  # noqa: E402
from tests.discordbot.conftest import BotThread  # noqa: E402
from tests.factories import LeaderboardFactory, local_cpu_pool, problem_from  # noqa: E402
from tests.fakes.discord import CHANNEL_ID, GUILD_ID, Attachment, FakeDiscord  # noqa: E402

CODE = (ROOT / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py").read_bytes()


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else (values or [float("nan")])[0]


def cancel_all(results) -> None:
    """Cancel every run in a process of its own, as an organiser's request to the site would (not in the bot's)."""
    cancelled_at: dict[int, float] = {}
    for run in Run.objects.select_related("submission").order_by("pk"):
        cancelled_at[run.submission_id] = time.monotonic()  # its last run: the submission's final state
        do_cancel_run(run)
    results.send(cancelled_at)  # CLOCK_MONOTONIC is one clock for every process of the machine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--submissions", type=int, default=200)
    parser.add_argument("--spread", type=float, default=2.0, help="seconds over which the interactions arrive")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("set DATABASE_URL to a PostgreSQL database (it is flushed)")
    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    pool = local_cpu_pool()
    board = LeaderboardFactory(name="bench", problem=problem_from(load_task(ROOT / "problems/demo/vectoradd_py")),
                               gpu_types=[pool.cpu])
    Guild.objects.create(guild_id=GUILD_ID, submission_channel_id=CHANNEL_ID)
    fake = FakeDiscord()
    fake.start()
    point_at(fake.url)
    bot = BotThread(fake)
    bot.start()
    try:
        interactions = []
        started = time.monotonic()
        for i in range(args.submissions):
            code = CODE + f"\n# {i}\n".encode()
            interactions.append(fake.command("leaderboard submit ranked", 800_000_000_000_000_000 + i % 50,
                                             script=Attachment(f"k{i}.py", code), leaderboard_name=board.name,
                                             gpu="CPU"))
            time.sleep(max(0.0, started + args.spread * (i + 1) / args.submissions - time.monotonic()))
        fake.wait_for(lambda: all(i in fake.answered for i in interactions), 120, "every answer")
        fake.wait_for(lambda: StatusMessage.objects.count() == args.submissions, 60, "every status row")
        time.sleep(2 * float(os.environ.get("DISCORD_EDIT_INTERVAL", "1")))
        firsts = [fake.answered[i] * 1000 for i in interactions]
        statuses = [(next(t for c, t in zip(m.history, m.changed_at, strict=True) if c) - fake.pushed_at[i]) * 1000
                    for i in interactions for m in [fake.original(i)]]
        spawn = multiprocessing.get_context("spawn")
        receiving, sending = spawn.Pipe(duplex=False)
        canceller = spawn.Process(target=cancel_all, args=(sending,))
        canceller.start()
        cancelled_at = receiving.recv()
        canceller.join()
        originals = {s.pk: fake.original(i) for s, i in zip(Submission.objects.order_by("pk"), interactions,
                                                                             strict=True)}

        def edited() -> bool:
            return all(m and "cancelled" in m.content.split("\n")[0] for m in originals.values())
        fake.wait_for(edited, 120, "every final edit")
        lags = []
        for sid, message in originals.items():
            at = next(t for c, t in zip(message.history, message.changed_at, strict=True)
                      if "cancelled" in c.split("\n")[0])
            lags.append((at - cancelled_at[sid]) * 1000)
        bot.idle()
        print(f"interactions: {args.submissions} over {args.spread:.1f} s; answered {len(fake.answered)}, "
              f"dropped {args.submissions - len([i for i in interactions if i in fake.answered])}")
        print(f"first answer (acknowledged, \"thinking…\"): p50 {statistics.median(firsts):.0f} ms, "
              f"p95 {p95(firsts):.0f} ms, max {max(firsts):.0f} ms")
        print(f"submission status shown: p50 {statistics.median(statuses):.0f} ms, p95 {p95(statuses):.0f} ms, "
              f"max {max(statuses):.0f} ms")
        print(f"state change → edited message: p50 {statistics.median(lags):.0f} ms, p95 {p95(lags):.0f} ms, "
              f"max {max(lags):.0f} ms")
        edits = sum(len(m.history) - 1 for m in originals.values())
        print(f"edits: {edits} ({edits / len(originals):.1f} per message); rate-limited (429): {fake.rate_limited}")
    finally:
        bot.stop()
        fake.stop()
        discord.http.Route.BASE = "https://discord.com/api/v10"


if __name__ == "__main__":
    main()
