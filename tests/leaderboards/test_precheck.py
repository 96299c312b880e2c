"""Issue 23: KernelBot's pre-check (kernelguard) as a second opinion. It reads every ranked submission's source at
submission time; its findings are stored on the submission and shown to staff beside the verdict, never to
competitors (the owner included); a crash or timeout lets the submission through unless it fails closed."""

from __future__ import annotations

import subprocess

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from leaderboards import precheck
from leaderboards.access.actions import do_create_token
from leaderboards.actions import SubmissionRejected, check_submission, do_submit
from leaderboards.models import Run, Submission

from ..factories import UserFactory

pytestmark = pytest.mark.skipif(precheck.installed_version() is None, reason="kernelguard is not installed")

HONEST = b"import torch\n\n\ndef custom_kernel(data):\n    a, b = data\n    return a + b\n"
# KernelBot's detector rule TIMER_MONKEYPATCH: the CUDA event timer is replaced so every benchmark reads 1 us
HACK = (b"import torch\n\ntorch.cuda.Event.elapsed_time = lambda self, other: 0.001\n\n\n"
        b"def custom_kernel(data):\n    a, b = data\n    return a + b\n")
RULE = "TIMER_MONKEYPATCH"


def bearer(user) -> dict[str, str]:
    return {"Authorization": f"Bearer {do_create_token(user)[1]}"}


def submit(leaderboard, content=HONEST, mode="leaderboard", user=None) -> Submission:
    user = user or UserFactory()
    return do_submit(user, check_submission(user, leaderboard.name, ["CPU"], mode, "sub.py", content))


@pytest.fixture
def no_child(monkeypatch):
    """Fails the test if anything starts kernelguard."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"kernelguard ran: {args}")
    monkeypatch.setattr(precheck.subprocess, "run", refuse)


@pytest.mark.django_db
def test_a_known_hack_is_recorded_and_shown_to_staff_but_to_no_competitor(client, admin_client, leaderboard):
    owner, other = UserFactory(), UserFactory()
    response = client.post("/api/v1/submissions", {"file": SimpleUploadedFile("hack.py", HACK), "gpu": "CPU",
                                                   "leaderboard": leaderboard.name}, headers=bearer(owner))
    assert response.status_code == 201  # recorded, not blocked: the harness decides the verdict
    sub = Submission.objects.get()
    assert sub.precheck["tool"] == "kernelguard" and sub.precheck["version"] == precheck.installed_version()
    assert sub.precheck["classification"] == "hacked" and sub.precheck["should_filter"] is True
    assert {finding["pattern"] for finding in sub.precheck["findings"]} == {RULE}
    assert "error" not in sub.precheck and sub.precheck["seconds"] < 10

    # staff: the submission's admin page, its runs' pages (beside the verdict) and the list, filterable
    page = admin_client.get(f"/admin/leaderboards/submission/{sub.pk}/change/").content.decode()
    assert RULE in page and "<strong>hacked; KernelBot would refuse it (high_critical)</strong>" in page
    assert "elapsed_time method patched" in page
    run = sub.runs.first()
    run_page = admin_client.get(f"/admin/leaderboards/run/{run.pk}/change/").content.decode()
    assert "KernelGuard pre-check" in run_page and RULE in run_page
    flagged = admin_client.get("/admin/leaderboards/submission/?precheck=flagged").content.decode()
    assert f"hacked: {RULE}" in flagged
    assert admin_client.get("/admin/leaderboards/submission/?precheck=clean").context["cl"].result_count == 0
    staff_api = client.get(f"/api/v1/submissions/{sub.pk}", headers=bearer(UserFactory(is_staff=True)))
    assert staff_api.status_code == 200

    # competitors: neither the owner nor anyone else, through the API, the site or popcorn
    answers = [response.content, staff_api.content]
    for user in (owner, other):
        answers.append(client.get(f"/api/v1/submissions/{sub.pk}", headers=bearer(user)).content)
        answers.append(client.get("/api/v1/submissions", headers=bearer(user)).content)
        client.force_login(user)
        answers.append(client.get(reverse("submission", args=[sub.pk])).content)
        answers.append(client.get(f"/popcorn/user/submissions/{sub.pk}",
                                  headers={"X-Popcorn-Cli-Id": do_create_token(user)[1]}).content)
    assert all(answer for answer in answers)
    for answer in answers:
        assert RULE not in answer.decode() and "kernelguard" not in answer.decode().lower()


@pytest.mark.django_db
def test_an_honest_submission_has_no_findings(admin_client, leaderboard):
    sub = submit(leaderboard)
    stored = Submission.objects.get(pk=sub.pk).precheck
    assert stored["classification"] == "valid" and stored["findings"] == [] and stored["should_filter"] is False
    assert stored == sub.precheck  # what do_submit returns is what it stored (either insert path)
    page = admin_client.get(f"/admin/leaderboards/submission/{sub.pk}/change/").content.decode()
    assert "<strong>valid</strong>" in page and "no findings" in page
    assert admin_client.get("/admin/leaderboards/submission/?precheck=clean").context["cl"].result_count == 1
    assert admin_client.get("/admin/leaderboards/submission/?precheck=findings").context["cl"].result_count == 0


@pytest.mark.django_db
def test_only_ranked_submissions_are_checked(leaderboard, no_child):
    for mode in ("test", "benchmark", "profile"):
        assert submit(leaderboard, HACK, mode=mode).precheck == {}
    assert Submission.objects.filter(precheck={}).count() == 3


@pytest.mark.django_db
@pytest.mark.parametrize(("change", "error"), [
    # its CLI refuses the option: a real crash, reported by its last line of stderr
    ({"KERNELGUARD_PROFILE": "no-such-profile"}, "exited with status 2: kernelguard.py: error: argument --profile"),
    ({"KERNELGUARD_TIMEOUT_S": 0.001}, "timed out after 0.001 s"),
])
def test_a_failed_precheck_fails_open_by_default(settings, admin_client, leaderboard, change, error):
    for name, value in change.items():
        setattr(settings, name, value)
    sub = submit(leaderboard, HACK)
    assert sub.runs.count() == 2 and Run.objects.count() == 2  # queued as if nothing had happened
    stored = Submission.objects.get(pk=sub.pk).precheck
    assert error in stored["error"] and "findings" not in stored
    page = admin_client.get(f"/admin/leaderboards/submission/{sub.pk}/change/").content.decode()
    assert "failed: " in page and "went ahead unchecked" in page
    assert admin_client.get("/admin/leaderboards/submission/?precheck=failed").context["cl"].result_count == 1


@pytest.mark.django_db
def test_fail_closed_refuses_with_a_clear_4xx_and_writes_nothing(settings, client, leaderboard):
    settings.KERNELGUARD_FAIL_OPEN = False
    settings.KERNELGUARD_PROFILE = "no-such-profile"
    with pytest.raises(SubmissionRejected) as info:
        submit(leaderboard)
    assert info.value.status == 422 and "could not check 'sub.py'" in info.value.message
    response = client.post("/api/v1/submissions", {"file": SimpleUploadedFile("a.py", HONEST), "gpu": "CPU",
                                                   "leaderboard": leaderboard.name}, headers=bearer(UserFactory()))
    assert response.status_code == 422 and "KernelGuard pre-check could not check" in response.json()["detail"]
    assert Submission.objects.count() == 0
    # a test run is not checked, so it is not refused either
    assert submit(leaderboard, mode="test").precheck == {}


@pytest.mark.django_db
def test_blocking_refuses_what_kernelguard_filters_as_kernelbot_does(settings, leaderboard):
    settings.KERNELGUARD_BLOCK = True
    with pytest.raises(SubmissionRejected) as info:
        submit(leaderboard, HACK)
    assert info.value.status == 400
    assert info.value.message == f"Submission rejected by KernelGuard pre-check (high_critical). Matched rules: {RULE}."
    assert Submission.objects.count() == 0
    assert submit(leaderboard).precheck["classification"] == "valid"


@pytest.mark.django_db
def test_setting_off_or_not_installed_does_not_run_it(settings, monkeypatch, leaderboard, no_child):
    settings.KERNELGUARD_ENABLED = False
    settings.KERNELGUARD_FAIL_OPEN = False  # nothing runs, so nothing can fail closed
    assert submit(leaderboard, HACK).precheck == {}
    settings.KERNELGUARD_ENABLED = True
    monkeypatch.setattr(precheck, "installed_version", lambda: None)
    assert submit(leaderboard, HACK).precheck == {}
    assert Submission.objects.filter(precheck={}).count() == 2


def test_the_child_gets_no_secrets_and_cannot_be_shadowed(monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "do-not-leak")
    seen = {}

    def run(command, **kwargs):
        seen.update(command=command, **kwargs)
        return subprocess.CompletedProcess(command, 0, '{"classification": "valid", "matched_patterns": []}\n', "")
    monkeypatch.setattr(precheck.subprocess, "run", run)
    assert precheck.summary(precheck.analyze("x = 1\n"))["classification"] == "valid"
    assert seen["command"][1:] == ["-I", "-m", "kernelguard", "--api-mode"]
    assert "SECRET_KEY" not in seen["env"] and seen["timeout"] == 10


def test_findings_are_bounded():
    result = {"classification": "hacked", "should_filter": True,
              "matched_patterns": [{"pattern": "X", "severity": "high", "evidence": "e" * 10_000}] * 500}
    kept = precheck.summary(result)
    assert len(kept["findings"]) == precheck.MAX_FINDINGS
    assert len(kept["findings"][0]["evidence"]) == precheck.MAX_EVIDENCE
