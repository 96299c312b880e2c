from django.http import HttpRequest

from .access.actions import accepting_jobs


def site_state(request: HttpRequest) -> dict:
    """`jobs_paused`: the jobs switch while submissions are refused (cached like every submission's own check)."""
    switch = accepting_jobs()
    return {"jobs_paused": None if switch.accepting else switch}
