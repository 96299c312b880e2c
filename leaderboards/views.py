from django.shortcuts import render

from .models import BoardEntry, Leaderboard


def home(request):
    leaderboards = list(Leaderboard.objects.listed().prefetch_related("gpu_types"))
    leaders = {e.leaderboard_id: e for e in BoardEntry.objects.filter(rank=1).select_related("user", "gpu_type")}
    for leaderboard in leaderboards:
        leaderboard.leader = leaders.get(leaderboard.pk)
    return render(request, "leaderboards/home.html", {"leaderboards": leaderboards})
