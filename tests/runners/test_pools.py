"""Pools as an organiser meets them: the one-page pool admin with backend settings and devices, what a node really
has (the probe, register_node, refusals), and who may take runs (health, dispatch, the submit door)."""

from __future__ import annotations

import json
import os
import stat

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.utils import timezone

from leaderboards import lifecycle
from leaderboards.access.actions import do_create_token
from leaderboards.actions import check_submission
from leaderboards.errors import SubmissionRejected
from leaderboards.lifecycle import MISCONFIGURED, candidate_pools, dispatch_run
from leaderboards.models import Run, RunStatus
from runners.admin import GpuPoolForm
from runners.backends.base import BACKENDS, backend_class, backend_for, validated_settings
from runners.harness.probe import device_mismatch, name_matches, probe
from runners.models import Gpu, GpuPool, GpuType, GpuVendor, Node, PoolHealth, RunnerBackendName

from ..conftest import require_tool
from ..factories import UserFactory, local_cpu_pool, remote_pool, submission
from .fake_backends import ClusterBackend

pytestmark = pytest.mark.django_db
CPU_ONLY = {"hostname": "cpu-box", "cpu": "AMD EPYC", "cpus": 2, "devices": [], "source": "none"}
L4_NODE = {"hostname": "l4-box", "cpu": "Intel Xeon", "cpus": 8, "source": "nvidia-smi", "devices": [
    {"index": 0, "name": "NVIDIA L4", "uuid": "GPU-aaaa", "memory_mib": 23034, "vendor": "nvidia"},
    {"index": 1, "name": "NVIDIA L4", "uuid": "GPU-bbbb", "memory_mib": 23034, "vendor": "nvidia"}]}


@pytest.fixture
def l4(db):
    return GpuType.objects.create(name="L4", vendor=GpuVendor.NVIDIA, architecture="sm_89")


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """A stand-in nvidia-smi on PATH answering as a machine with one L4 does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text("#!/bin/sh\necho '0, NVIDIA L4, GPU-1234abcd, 23034'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


@pytest.fixture
def backends(monkeypatch):
    monkeypatch.setitem(BACKENDS, RunnerBackendName.SLURM, "tests.runners.fake_backends.ClusterBackend")
    monkeypatch.setitem(BACKENDS, RunnerBackendName.MODAL, "tests.runners.fake_backends.MissingClientBackend")


@pytest.mark.parametrize(("type_name", "device", "fits"), [
    ("L4", "NVIDIA L4", True), ("L4", "NVIDIA L40S", False), ("H100", "NVIDIA H100 80GB HBM3", True),
    ("h100", "NVIDIA H100 NVL", True), ("A100", "NVIDIA A100-SXM4-80GB", True), ("MI300", "AMD Instinct MI300X", True),
    ("H100", "NVIDIA H200", False), ("L4", "cpu", False), ("", "NVIDIA L4", False),
    ("A100-80GB", "NVIDIA A100-SXM4-80GB", True), ("A100-80GB", "NVIDIA A100 80GB PCIe", True),
    ("A100-80GB", "NVIDIA A100-SXM4-40GB", False), ("A10", "NVIDIA A100-SXM4-80GB", False),
    ("RTX 4090", "NVIDIA GeForce RTX 4090", True), ("H200", "NVIDIA GH200 480GB", False), ("T4", "Tesla T4", True)])
def test_a_type_name_matches_a_device_as_a_model_number(type_name, device, fits):
    assert name_matches(type_name, device) is fits


@pytest.mark.parametrize(("type_name", "vendor", "device", "fits"), [
    ("L4", GpuVendor.NVIDIA, "NVIDIA L4", True), ("L4", GpuVendor.NVIDIA, "NVIDIA L40S", False),
    ("A100-80GB", GpuVendor.NVIDIA, "NVIDIA A100-SXM4-80GB", True), ("MI300", GpuVendor.NVIDIA, "AMD Instinct MI300X",
                                                                        False),
    ("H100", GpuVendor.NVIDIA, "cpu", False), ("CPU", GpuVendor.CPU, "NVIDIA H100", True)])
def test_nodes_and_results_are_checked_by_one_rule(type_name, vendor, device, fits):
    """Registration (a node's probe) and the lifecycle (a result's system info) agree on every device."""
    gpu_type = GpuType(name=type_name, vendor=vendor)
    node = {"hostname": "n1", "devices": [{"index": 0, "name": device, "vendor": "amd" if "AMD" in device else
                                            "nvidia"}]} if device != "cpu" else {"hostname": "n1", "devices": []}
    assert (lifecycle.gpu_mismatch(gpu_type, {"device": device}) == "") is fits
    assert (device_mismatch(type_name, vendor, 0, node) is None) is fits


def test_a_dispatch_the_service_refuses_is_the_pools_failure_and_the_run_goes_elsewhere_or_waits(
        leaderboard, cpu_pool, backends):
    """BackendUnavailable from `dispatch` (bad credentials, unknown host, repository or app) is not chance: the pool
    fails with the service's message (what to fix) until a check passes; the run is neither retried into the same
    refusal nor charged: it goes to another pool, or waits for one. A run pinned to the pool (a check's) ends."""
    refusing = remote_pool(RunnerBackendName.SLURM, cpu_pool.cpu, name="refusing",
                           settings={"partition": "gpu", "time_limit_min": 30, "key_env": "K"})
    GpuPool.objects.filter(pk=cpu_pool.pk).update(enabled=False)
    run = submission(leaderboard, mode="test").runs.get()
    ClusterBackend.refuse = "the cluster refused the account 'nobody'"
    try:
        dispatch_run(run.pk)
        run.refresh_from_db()
        assert (run.status, run.infra_failures, run.error) == (RunStatus.QUEUED, 0, lifecycle.WAITS_FOR_FIX)
        assert list(run.attempts.values_list("pool", "outcome", "reason")) == [
            (refusing.pk, "retried", "the cluster refused the account 'nobody'")]  # the organisers'
        refusing.refresh_from_db()
        assert refusing.health == PoolHealth.FAILING
        assert refusing.health_detail == ("Slurm refused the pool's configuration: the cluster refused the account "
                                          "'nobody'")
        dispatch_run(run.pk)  # no pool takes runs: it waits, not sent into the same refusal
        run.refresh_from_db()
        assert run.status == RunStatus.QUEUED and run.attempts.count() == 1
        GpuPool.objects.filter(pk=cpu_pool.pk).update(enabled=True)
        dispatch_run(run.pk)  # another pool serves its type: it goes there
        run.refresh_from_db()
        assert run.status == RunStatus.DISPATCHED and run.attempts.get(number=2).pool_id == cpu_pool.pk

        check = submission(leaderboard, mode="test").runs.get()
        Run.objects.filter(pk=check.pk).update(pool=refusing)
        dispatch_run(check.pk)
        check.refresh_from_db()
        assert (check.status, check.error) == (RunStatus.ERROR, MISCONFIGURED)  # a check's run: its check fails
    finally:
        ClusterBackend.refuse = ""


def test_the_probe_reads_nvidia_smi(fake_smi):
    report = probe()
    assert report["source"] == "nvidia-smi"
    assert report["devices"] == [{"index": 0, "name": "NVIDIA L4", "uuid": "GPU-1234abcd", "memory_mib": 23034,
                                  "vendor": "nvidia"}]
    assert device_mismatch("L4", "nvidia", 0, report) is None
    assert "has no device #1" in device_mismatch("L4", "nvidia", 1, report)
    assert "is a NVIDIA L4, not H100" in device_mismatch("H100", "nvidia", 0, report)


def test_register_node_refuses_an_l4_on_a_cpu_only_node_and_writes_nothing(l4, tmp_path):
    pool = GpuPool.objects.create(name="lab", backend=RunnerBackendName.SLURM)
    report = tmp_path / "probe.json"
    report.write_text(json.dumps(CPU_ONLY))
    with pytest.raises(CommandError, match=r"refused: cpu-box has no GPU \(CPU only: AMD EPYC\), so it cannot serve"):
        call_command("register_node", "lab", "--gpu-type", "L4", "--probe-file", str(report))
    assert not Node.objects.filter(pool=pool).exists()


def test_register_node_from_a_probe_report_recognises_and_updates_devices(l4, tmp_path, capsys):
    GpuType.objects.create(name="L40S", vendor=GpuVendor.NVIDIA)
    pool = GpuPool.objects.create(name="lab", backend=RunnerBackendName.SLURM)
    report = tmp_path / "probe.json"
    report.write_text(json.dumps(L4_NODE))
    call_command("register_node", "lab", "--probe-file", str(report))
    gpus = list(Gpu.objects.filter(node__pool=pool).select_related("node", "gpu_type"))
    assert [(g.node.hostname, g.index, g.gpu_type.name, g.uuid, g.memory_mib) for g in gpus] == [
        ("l4-box", 0, "L4", "GPU-aaaa", 23034), ("l4-box", 1, "L4", "GPU-bbbb", 23034)]
    assert all(g.checked_at and g.device_name == "NVIDIA L4" for g in gpus)
    assert "2 devices added" in capsys.readouterr().out

    report.write_text(json.dumps({**L4_NODE, "devices": L4_NODE["devices"][:1]}))  # one card was pulled
    call_command("register_node", "lab", "--probe-file", str(report))
    assert list(Gpu.objects.filter(node__pool=pool).values_list("index", "enabled")) == [(0, True), (1, False)]
    with pytest.raises(CommandError, match="device #0 on l4-box is a NVIDIA L4, not H100"):
        GpuType.objects.create(name="H100", vendor=GpuVendor.NVIDIA)
        call_command("register_node", "lab", "--gpu-type", "h100", "--probe-file", str(report))


def test_register_node_probes_this_machine(cpu_pool, fake_smi, l4):
    call_command("register_node", cpu_pool.name, "--hostname", "this-box")
    gpu = Gpu.objects.get(node__hostname="this-box")
    assert (gpu.gpu_type, gpu.device_name, gpu.uuid) == (l4, "NVIDIA L4", "GPU-1234abcd")


# --- the pool page ---------------------------------------------------------------------------------------------
def pool_form(**fields) -> dict:
    data = {"name": "cluster", "backend": "slurm", "enabled": "on", "memory_limit_mib": "",
            "devices-TOTAL_FORMS": "0", "devices-INITIAL_FORMS": "0", "devices-MIN_NUM_FORMS": "0",
            "devices-MAX_NUM_FORMS": "1000"}
    devices = fields.pop("devices", [])
    initial = fields.pop("initial", 0)
    for i, device in enumerate(devices):
        data.update({f"devices-{i}-{k}": v for k, v in device.items()})
    data.update({"devices-TOTAL_FORMS": str(len(devices)), "devices-INITIAL_FORMS": str(initial)})
    return {**data, **fields}


def test_pool_pages_render_with_backend_settings_as_fields(admin_client, backends, cpu_pool):
    add = admin_client.get("/admin/runners/gpupool/add/").content.decode()
    assert 'name="slurm-partition"' in add and "The Slurm partition runs go to." in add
    assert '<option value="slurm">Slurm</option>' in add and '<option value="modal"' not in add
    assert "Modal: the service&#x27;s client library is not installed." in add
    assert 'name="devices-0-hostname"' in add  # devices on the same page
    listing = admin_client.get("/admin/runners/gpupool/").content.decode()
    assert "Not checked yet" in listing and "1 (one per enabled device)" in listing and "CPU" in listing
    page = admin_client.get(f"/admin/runners/gpupool/{cpu_pool.pk}/change/").content.decode()
    assert "Check health now" in page and "Check this machine's devices" in page
    assert 'value="localhost"' in page and "none needed" in page
    assert f"/admin/runners/poolcheck/?pool__id__exact={cpu_pool.pk}" in page
    assert admin_client.get(f"/admin/runners/poolcheck/?pool__id__exact={cpu_pool.pk}").status_code == 200
    assert admin_client.get("/admin/runners/node/").status_code == 200
    assert admin_client.get("/admin/runners/gpu/").status_code == 200


def test_bad_backend_settings_are_form_errors_and_nothing_is_saved(admin_client, backends, l4):
    response = admin_client.post("/admin/runners/gpupool/add/", pool_form(**{
        "slurm-partition": "", "slurm-time_limit_min": "0", "slurm-key_env": "FAKE_CLUSTER_KEY",
        "devices": [{"hostname": "gpu01", "index": "0", "gpu_type": str(l4.pk), "enabled": "on"}]}))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors["slurm-partition"] == ["This field is required."]
    assert errors["slurm-time_limit_min"] == ["Ensure this value is greater than or equal to 1."]
    assert not GpuPool.objects.filter(name="cluster").exists() and not Node.objects.filter(hostname="gpu01").exists()


def test_a_pool_with_settings_and_devices_is_made_on_one_page(admin_client, backends, l4, monkeypatch):
    monkeypatch.setenv("FAKE_CLUSTER_KEY", "secret")
    monkeypatch.delenv("KERNELBOT_RUNNER_KEY", raising=False)
    response = admin_client.post("/admin/runners/gpupool/add/", pool_form(**{
        "slurm-partition": "gpu", "slurm-time_limit_min": "30", "slurm-key_env": "FAKE_CLUSTER_KEY",
        "devices": [{"hostname": "gpu01", "index": "0", "gpu_type": str(l4.pk), "enabled": "on"},
                    {"hostname": "gpu01", "index": "1", "gpu_type": str(l4.pk), "enabled": "on"},
                    {"hostname": "gpu02", "index": "0", "gpu_type": str(l4.pk), "enabled": "on"}]}))
    assert response.status_code == 302, response.context["adminform"].form.errors
    pool = GpuPool.objects.get(name="cluster")
    assert pool.settings == {"partition": "gpu", "time_limit_min": 30, "key_env": "FAKE_CLUSTER_KEY"}
    assert list(Gpu.objects.filter(node__pool=pool).values_list("node__hostname", "index")) == [
        ("gpu01", 0), ("gpu01", 1), ("gpu02", 0)]
    page = admin_client.get(f"/admin/runners/gpupool/{pool.pk}/change/").content.decode()
    assert "<code>FAKE_CLUSTER_KEY</code> is set" in page and "<code>KERNELBOT_RUNNER_KEY</code> is NOT SET" in page
    assert 'value="gpu"' in page and "(FAKE_CLUSTER_KEY is set here.)" in page
    assert "secret" not in json.dumps(pool.settings)

    # move gpu02's device to gpu01 and drop a device: the emptied machine goes
    gpus = list(Gpu.objects.filter(node__pool=pool).order_by("node__hostname", "index"))
    rows = [{"id": str(g.pk), "hostname": "gpu01", "index": str(i), "gpu_type": str(l4.pk), "enabled": "on"}
            for i, g in enumerate(gpus)]
    rows[1]["DELETE"] = "on"
    rows[2]["index"] = "1"
    response = admin_client.post(f"/admin/runners/gpupool/{pool.pk}/change/", pool_form(**{
        "slurm-partition": "gpu", "slurm-time_limit_min": "30", "slurm-key_env": "FAKE_CLUSTER_KEY",
        "devices": rows, "initial": 3}))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert list(Gpu.objects.filter(node__pool=pool).values_list("node__hostname", "index")) == [
        ("gpu01", 0), ("gpu01", 1)]
    assert list(Node.objects.filter(pool=pool).values_list("hostname", flat=True)) == ["gpu01"]


def test_a_pool_on_this_machine_cannot_claim_a_gpu_it_does_not_have(admin_client, cpu_pool, l4):
    if any(d["vendor"] == "nvidia" and name_matches("L4", d["name"]) for d in probe()["devices"]):
        l4 = GpuType.objects.create(name="MI300", vendor=GpuVendor.AMD)  # this machine has an L4: claim the absent
    cpu = Gpu.objects.get(node__pool=cpu_pool)
    response = admin_client.post(f"/admin/runners/gpupool/{cpu_pool.pk}/change/", pool_form(**{
        "name": cpu_pool.name, "backend": "local", "initial": 1, "devices": [
            {"id": str(cpu.pk), "hostname": "localhost", "index": "0", "gpu_type": str(cpu.gpu_type_id),
             "enabled": "on"},
            {"hostname": "localhost", "index": "1", "gpu_type": str(l4.pk), "enabled": "on"}]}))
    assert response.status_code == 200
    page = response.content.decode()
    assert "Refused: " in page and (f"cannot serve {l4.name}" in page or f", not {l4.name}" in page)
    assert not Gpu.objects.filter(gpu_type=l4).exists()


def test_another_machines_devices_may_be_typed_and_wait_for_its_agent(admin_client, cpu_pool):
    """A local pool's other machines are checked by their own agents when they start: typed rows are a forecast,
    accepted, and get no run until that agent registers what it really has."""
    h100 = GpuType.objects.create(name="H100")
    cpu = Gpu.objects.get(node__pool=cpu_pool)
    response = admin_client.post(f"/admin/runners/gpupool/{cpu_pool.pk}/change/", pool_form(**{
        "name": cpu_pool.name, "backend": "local", "initial": 1, "devices": [
            {"id": str(cpu.pk), "hostname": "localhost", "index": "0", "gpu_type": str(cpu.gpu_type_id),
             "enabled": "on"},
            {"hostname": "gpu-node-7", "index": "0", "gpu_type": str(h100.pk), "enabled": "on"}]}))
    assert response.status_code == 302
    assert Gpu.objects.filter(gpu_type=h100, node__hostname="gpu-node-7").exists()
    page = admin_client.get(f"/admin/runners/gpupool/{cpu_pool.pk}/change/").content.decode()
    assert "no agent on gpu-node-7" in page and "agent on localhost" in page


def test_a_pool_on_this_machine_may_claim_the_gpu_its_probe_finds(admin_client, cpu_pool, l4, fake_smi):
    cpu = Gpu.objects.get(node__pool=cpu_pool)
    response = admin_client.post(f"/admin/runners/gpupool/{cpu_pool.pk}/change/", pool_form(**{
        "name": cpu_pool.name, "backend": "local", "initial": 1, "devices": [
            {"id": str(cpu.pk), "hostname": "localhost", "index": "0", "gpu_type": str(l4.pk), "enabled": "on"}]}))
    assert response.status_code == 302
    response = admin_client.post(f"/admin/runners/gpupool/{cpu_pool.pk}/check-devices/", follow=True)
    assert "every enabled device is as claimed" in response.content.decode()
    cpu.refresh_from_db()
    assert cpu.gpu_type == l4 and cpu.device_name == "NVIDIA L4" and cpu.checked_at


def test_the_device_check_disables_a_claim_the_machine_contradicts(admin_client, cpu_pool, l4):
    node = Node.objects.get(pool=cpu_pool)
    Gpu.objects.create(node=node, index=5, gpu_type=l4)
    response = admin_client.post("/admin/runners/gpupool/", {"action": "check_devices",
                                                             "_selected_action": [cpu_pool.pk]}, follow=True)
    page = response.content.decode()
    assert "Those devices are now disabled" in page
    assert not Gpu.objects.get(node=node, index=5).enabled and Gpu.objects.get(node=node, index=0).enabled


# --- who takes runs ---------------------------------------------------------------------------------------------
def fail(pool: GpuPool) -> None:
    GpuPool.objects.filter(pk=pool.pk).update(health=PoolHealth.FAILING, last_checked_at=timezone.now(),
                                              health_detail="CPU: run 1 ended Error")


def test_dispatch_skips_a_failing_pool_and_a_run_waits_while_every_pool_fails(leaderboard, cpu_pool):
    other = local_cpu_pool("spare")
    run = submission(leaderboard, mode="test").runs.get()
    assert candidate_pools(run) == [cpu_pool, other]
    fail(cpu_pool)
    assert candidate_pools(run) == [other]
    fail(other)
    assert candidate_pools(run) == []
    Run.objects.filter(pk=run.pk).update(pool=cpu_pool)  # a health check's run goes to its pool, failing or not
    run.refresh_from_db()
    assert candidate_pools(run) == [cpu_pool]
    Run.objects.filter(pk=run.pk).update(pool=None)
    run.refresh_from_db()
    dispatch_run(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.attempt == 0  # not an error: it goes once a pool passes a check

    GpuPool.objects.filter(pk=other.pk).update(enabled=False)
    GpuPool.objects.filter(pk=cpu_pool.pk).update(enabled=False)
    dispatch_run(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.ERROR and "no enabled GPU pool serves CPU" in run.error


def test_a_failing_pool_is_refused_at_the_door_with_a_precise_message(leaderboard, cpu_pool, client):
    fail(cpu_pool)
    user = UserFactory()
    with pytest.raises(SubmissionRejected) as info:
        check_submission(user, leaderboard.name, ["CPU"], "test", "a.py", b"def custom_kernel(d): ...")
    assert info.value.status == 503
    assert info.value.message.startswith("GPU 'CPU' is unavailable: its runners failed their health check at ")
    assert info.value.message.endswith("UTC and take no runs until they pass one; try again later.")

    client.force_login(user)
    page = client.get("/submit/").content.decode()
    assert "CPU is unavailable: its runners failed their health check" in page and "CPU (unavailable)" in page
    response = client.post("/submit/", {"leaderboard": leaderboard.name, "gpu": "CPU", "mode": "test",
                                        "code": "def custom_kernel(d): ..."})
    assert response.status_code == 503 and "GPU &#x27;CPU&#x27; is unavailable" in response.content.decode()
    assert not Run.objects.exists()

    api = client.post("/api/v1/submissions", {"leaderboard": leaderboard.name, "mode": "test", "gpu": "CPU",
                                              "file": SimpleUploadedFile("a.py", b"def custom_kernel(d): ...")},
                      headers={"Authorization": f"Bearer {do_create_token(user)[1]}"})
    assert api.status_code == 503 and "its runners failed their health check" in api.json()["detail"]


@pytest.mark.parametrize(("backend", "stored"), [
    (RunnerBackendName.SLURM, {"partition": "gpu", "gres": {"H100": "gpu:h100"}, "sandbox": "require",
                               "extra_args": ["--constraint=sm90", "--mem=64G", "--comment=two words"]}),
    (RunnerBackendName.GITHUB, {"repository": "org/gpu-runners", "runner_labels": {"H100": ["self-hosted", "h100"]},
                                "queue_timeout": 600}),
    (RunnerBackendName.MODAL, {"app_name": "kernelbot", "functions": {"H100": "run_h100"}})])
def test_a_saved_pool_page_saves_again_unchanged_with_readable_labels(db, monkeypatch, backend, stored):
    """What the change page shows for stored settings is what its form accepts: saving an untouched page keeps
    them (an organiser once met "'[]': only long options" on re-saving a Slurm pool)."""
    if backend == RunnerBackendName.SLURM:
        require_tool("sbatch")  # the backend refuses a pool it cannot reach: no sbatch here and no ssh login node
    monkeypatch.setenv("MODAL_TOKEN_ID", "ak-x")
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-x")
    pool = GpuPool.objects.create(name="p", backend=backend, settings=stored)
    shown = GpuPoolForm(instance=pool)
    assert shown[f"{backend}-queue_timeout"].label == "Queue timeout"
    data = {}
    for name in shown.fields:
        value = shown[name].value()
        if value is True:
            data[name] = "on"
        elif value not in (None, False):
            data[name] = str(value)
    if backend == RunnerBackendName.SLURM:
        assert data["slurm-extra_args"] == "--constraint=sm90 --mem=64G '--comment=two words'"
    again = GpuPoolForm(data=data, instance=pool)
    assert again.is_valid(), again.errors
    again.save()
    pool.refresh_from_db()
    options = backend_class(backend).options
    assert {key: pool.settings.get(key) for key in stored} == stored  # and the defaults the page showed
    shown_defaults = {k: f.initial for k, f in options.base_fields.items() if f.initial not in (None, "")}
    assert validated_settings(pool, options) == validated_settings(GpuPool(settings={**shown_defaults, **stored}),
                                                                   options)
    assert backend_for(pool).settings.get("extra_args", []) == stored.get("extra_args", [])  # what dispatch reads


def test_pools_machines_and_devices_are_searchable_in_the_admin(admin_client, cpu_pool):
    other = GpuPool.objects.create(name="farm")
    Gpu.objects.create(node=Node.objects.create(pool=other, hostname="gpu-node-9"), gpu_type=cpu_pool.cpu, index=3)
    found = admin_client.get("/admin/runners/gpupool/?q=gpu-node-9").content.decode()
    assert "farm" in found and f'/admin/runners/gpupool/{cpu_pool.pk}/change/' not in found
    devices = admin_client.get("/admin/runners/gpu/?q=localhost").content.decode()
    assert "#0 on localhost" in devices and "#3 on gpu-node-9" not in devices and "1 result" in devices
    assert "gpu-node-9" in admin_client.get("/admin/runners/node/?q=node-9").content.decode()
    assert "0 results" in admin_client.get("/admin/runners/node/?q=nowhere").content.decode()


@pytest.mark.django_db
def test_the_secrets_panel_names_a_github_pools_default_variables(admin_client, monkeypatch):
    """Issue 36: a GitHub pool whose settings leave the token and webhook secret to their defaults still lists
    GITHUB_TOKEN and GITHUB_WEBHOOK_SECRET among the secrets it reads."""
    monkeypatch.setenv("GITHUB_TOKEN", "x")
    monkeypatch.delenv("GITHUB_WEBHOOK_SECRET", raising=False)
    pool = GpuPool.objects.create(name="gh", backend=RunnerBackendName.GITHUB, settings={"repository": "o/r"})
    page = admin_client.get(f"/admin/runners/gpupool/{pool.pk}/change/").content.decode()
    assert "<code>GITHUB_TOKEN</code> is set" in page and "<code>GITHUB_WEBHOOK_SECRET</code> is NOT SET" in page
