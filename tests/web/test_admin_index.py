"""The admin index a first-time organiser lands on: models grouped by task, named as people say them, and a
"Start here" path through a first competition."""

import re

import pytest

pytestmark = pytest.mark.django_db


def groups(page: str) -> dict[str, list[str]]:
    """{group caption: [model names]} as the index renders them."""
    found = {}
    for block in re.findall(r'<div class="app-group\d module".*?</table>', page, re.S):
        caption = re.search(r'<span class="section">(.*?)</span>', block).group(1)
        found[caption] = re.findall(r'<th scope="row"><a href="[^"]+">(.*?)</a></th>', block)
    return found


def test_admin_index_groups_models_by_task_with_a_start_here_path(admin_client):
    page = admin_client.get("/admin/").content.decode()
    shown = groups(page)
    assert list(shown) == ["Competitions", "GPUs and runners", "People and access", "Discord", "Internals"]
    assert shown["Competitions"] == ["Competitions", "Problems", "Leaderboards", "Submissions", "Runs"]
    assert shown["GPUs and runners"] == ["GPU types", "GPU pools", "Nodes", "GPUs", "Pool health checks"]
    assert shown["People and access"][:3] == ["Users", "Groups", "API tokens"]
    assert "Jobs switch" in shown["People and access"] and "Submission quotas" in shown["People and access"]
    internals = shown["Internals"]
    assert internals[:6] == ["Boards", "Board entries", "Codes", "Pending logins", "Profiles", "Live events"]
    assert {"Scheduled tasks", "Failed tasks"} <= set(internals)  # django-q's tables, and whatever else is left
    assert "Problems, the leaderboards that rank them" in page

    start = page[page.index("Start here"):page.index("app-group1")]
    links = re.findall(r'<a href="([^"]+)">', start)
    assert links == ["/admin/leaderboards/problem/upload/", "/admin/runners/gpupool/",
                     "/admin/leaderboards/leaderboard/", "/admin/leaderboards/invite/",
                     "/admin/leaderboards/submission/", "/admin/leaderboards/jobswitch/"]
    for link in links:  # the jobs switch's list opens the one switch
        assert admin_client.get(link, follow=True).status_code == 200, link


def test_an_app_page_and_the_sidebar_still_work(admin_client):
    assert "GPU pools" in admin_client.get("/admin/runners/").content.decode()
    sidebar = admin_client.get("/admin/runners/gpu/").content.decode()
    assert 'id="nav-sidebar"' in sidebar and "People and access" in sidebar
