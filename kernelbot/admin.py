"""The admin site, its index grouped by task so a first-time organiser finds their way in."""

from django.contrib import admin
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

# (title, what it is for, models as "app_label.ModelName"); models not named here fall into the last group.
GROUPS: list[tuple[str, str, list[str]]] = [
    ("Competitions", "Problems, the leaderboards that rank them, and what people submit to them.",
     ["leaderboards.Competition", "leaderboards.Problem", "leaderboards.Leaderboard", "leaderboards.Submission",
      "leaderboards.Run"]),
    ("GPUs and runners", "The kinds of GPU, the pools that run the jobs, the machines and GPUs in each pool, and "
     "the health checks that keep them honest.",
     ["runners.GpuType", "runners.GpuPool", "runners.Node", "runners.Gpu", "runners.PoolCheck"]),
    ("People and access", "Who may sign in, submit and see what; the switch that pauses all new jobs.",
     ["auth.User", "auth.Group", "leaderboards.ApiToken", "leaderboards.Invite", "leaderboards.Membership",
      "leaderboards.Ban", "leaderboards.SubmissionQuota", "leaderboards.JobSwitch"]),
    ("Discord", "The servers the bot serves: the channels it takes submissions in and posts to, and the roles that "
     "count as organisers.",
     ["discordbot.Guild", "discordbot.Announcement", "discordbot.StatusMessage"]),
    ("Internals", "Kept by the platform itself: rankings, stored code, sign-in state, live events, task queues. "
     "Read, rarely edit.",
     ["leaderboards.Board", "leaderboards.BoardEntry", "leaderboards.Code", "leaderboards.PendingLogin",
      "leaderboards.Profile", "leaderboards.LiveEvent"]),
]
# (step, URL name): the path through a first competition.
START_HERE: list[tuple[str, str]] = [
    ("Import a problem (a zip of task.yml and its files)", "admin:leaderboards_problem_upload"),
    ("Check the GPU pools that will run the jobs", "admin:runners_gpupool_changelist"),
    ("Create or open a leaderboard: deadline, GPUs, visibility", "admin:leaderboards_leaderboard_changelist"),
    ("Invite people to a closed leaderboard", "admin:leaderboards_invite_changelist"),
    ("Watch submissions and their runs", "admin:leaderboards_submission_changelist"),
    ("Pause or resume all new jobs", "admin:leaderboards_jobswitch_changelist"),
]


class KernelbotAdminSite(admin.AdminSite):
    site_header = "kernelbot admin"
    site_title = "kernelbot admin"
    index_title = "Run a competition"
    index_template = "admin/kernelbot_index.html"

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[dict]:
        """The index and the sidebar list the models by task (GROUPS); an app's own page keeps Django's list."""
        if app_label:
            return super().get_app_list(request, app_label)
        models = {f"{app['app_label']}.{model['object_name']}": model
                  for app in self._build_app_dict(request).values() for model in app["models"]}
        index = reverse("admin:index", current_app=self.name)
        groups = []
        for number, (title, description, names) in enumerate(GROUPS, start=1):
            chosen = [models.pop(name) for name in names if name in models]
            if number == len(GROUPS):
                chosen += sorted(models.values(), key=lambda m: m["name"])
            if chosen:
                groups.append({"name": title, "description": description, "app_label": f"group{number}",
                               "app_url": f"{index}#group{number}", "has_module_perms": True, "models": chosen})
        return groups

    @staticmethod
    def sandboxes() -> list[tuple[str, str, bool]]:
        """(node, what isolates its runs, isolated) for every enabled node that reported its sandbox facts
        (`runners.harness.probe.sandbox_facts`): whether submissions run in bubblewrap with a memory cgroup."""
        from runners.models import Node  # the admin site is built before the apps' models load

        shown = []
        for node in Node.objects.filter(enabled=True).select_related("pool").order_by("pool__name", "hostname"):
            facts = node.sandbox or {}
            if not facts:
                continue
            backend = str(facts.get("backend") or "unavailable")
            memory = f"memory cgroup {facts['memory_cgroup']}" if facts.get("memory_cgroup") else \
                f"no memory cgroup ({facts.get('memory_cgroup_error') or 'none usable'})"
            isolated = backend == "bubblewrap" and bool(facts.get("memory_cgroup"))
            why = f" — {facts['error']}" if facts.get("error") else ""
            shown.append((f"{node.pool.name} / {node.hostname}", f"{backend}, {memory}{why}", isolated))
        return shown

    def index(self, request: HttpRequest, extra_context: dict | None = None):
        extra_context = {"sandboxes": self.sandboxes(), **(extra_context or {})}
        steps = []
        for label, url_name in START_HERE:
            try:
                steps.append((label, reverse(url_name, current_app=self.name)))
            except NoReverseMatch:  # a model this site does not register
                continue
        return super().index(request, {"start_here": steps, **(extra_context or {})})
