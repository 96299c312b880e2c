"""The importer refuses what cannot run, before anyone submits: a reference.py without the trusted harness's names,
and code that asks for CUDA on a board whose GPU types have none (warned about on the board page and in the admin
for boards that already exist)."""

import io
import re
import zipfile
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from leaderboards.importing import ImportRejected, do_import_task
from leaderboards.models import HarnessProtocol, Leaderboard, Problem
from runners.models import GpuType, GpuVendor
from taskspec.loader import load_task

from ..conftest import REPO
from ..factories import LeaderboardFactory, problem_from

pytestmark = pytest.mark.django_db
DEMO = REPO / "problems" / "demo"

# princeton/cross_entropy_py's shape: a reference written for its own eval.py, on CUDA
CROSS_ENTROPY_REFERENCE = """import torch
DEVICE = "cuda"
def reference_forward(logits, targets): ...
def generate_inputs(batch_size, vocab_size, seed=42):
    return torch.randn(batch_size, vocab_size, device=DEVICE)
"""
EVAL = "import reference\nprint('ok')\n"
# pmpp_v2/vectorsum_py's shape: the trusted names, inputs made on CUDA
CUDA_REFERENCE = """import torch
from utils import match_reference

def generate_input(size: int, seed: int):
    gen = torch.Generator(device="cuda")
    return torch.randn(size, device="cuda", generator=gen)

def ref_kernel(data):
    return data.sum()

def check_implementation(data, output):
    return match_reference(output, ref_kernel(data), rtol=1e-5, atol=1e-5)
"""
CUDA_TEMPLATE = "def custom_kernel(data):\n    return data.sum()\n"
KERNELBOT_HINT = "keep the task's own eval.py (the popcorn protocol): --harness popcorn, or auto"
CUDA_LINES = ('reference.py line 5: gen = torch.Generator(device="cuda"); reference.py line 6: '
              'return torch.randn(size, device="cuda", generator=gen)')


def write_task(base: Path, name: str, files: dict[str, str], main: str | None = None) -> Path:
    task_dir = base / name
    task_dir.mkdir(parents=True)
    entries = ['  - {name: "submission.py", source: "@SUBMISSION@"}']
    for file, text in files.items():
        (task_dir / file).write_text(text)
        entries.append(f'  - {{name: "{file}", source: "{file}"}}')
    config = f'config:\n  main: "{main}"\n' if main else ""
    (task_dir / "task.yml").write_text("files:\n" + "\n".join(entries) + f'\nlang: "py"\ndescription: {name}\n'
                                       f"{config}tests:\n  - {{size: 8, seed: 1}}\nbenchmarks:\n"
                                       "  - {size: 8, seed: 2}\n")
    return task_dir


def zipped(task_dir: Path) -> io.BytesIO:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in task_dir.iterdir():
            archive.write(path, f"{task_dir.name}/{path.name}")
    buffer.seek(0)
    buffer.name = f"{task_dir.name}.zip"
    return buffer


@pytest.fixture
def cpu(db):
    return GpuType.objects.create(name="CPU", vendor=GpuVendor.CPU)


@pytest.fixture
def h100(db):
    return GpuType.objects.create(name="H100", vendor=GpuVendor.NVIDIA)


@pytest.fixture
def cross_entropy(tmp_path) -> Path:
    return write_task(tmp_path, "cross_entropy_py", {"reference.py": CROSS_ENTROPY_REFERENCE, "eval.py": EVAL},
                      main="eval.py")


@pytest.fixture
def vectorsum(tmp_path) -> Path:
    utils = (DEMO / "utils.py").read_text()  # its device: cuda when torch.cuda.is_available(), else the CPU
    return write_task(tmp_path, "vectorsum_py", {"reference.py": CUDA_REFERENCE, "utils.py": utils})


def test_the_trusted_harness_refuses_a_reference_without_its_names(cpu, cross_entropy):
    task = load_task(cross_entropy)
    with pytest.raises(ImportRejected) as info:
        do_import_task(task, harness="kernelbot")
    assert info.value.errors == [
        "problem cross_entropy_py: the trusted harness calls generate_input, ref_kernel, check_implementation from "
        "reference.py, which does not define generate_input, ref_kernel, check_implementation; " + KERNELBOT_HINT]
    assert not Problem.objects.exists()
    do_import_task(task)  # auto: its own eval.py, as it runs today
    assert Problem.objects.get().harness == HarnessProtocol.POPCORN


def test_the_refusal_names_only_what_is_missing(cpu, tmp_path):
    gather = write_task(tmp_path, "gather", {  # KernelBot's examples/gather
        "reference.py": "def generate_input(seed, world_size, rank): ...\ndef check_implementation(d, o): ...\n",
        "eval.py": EVAL}, main="eval.py")
    with pytest.raises(ImportRejected, match=re.escape("which does not define ref_kernel; " + KERNELBOT_HINT)):
        do_import_task(load_task(gather), harness="kernelbot")
    alone = write_task(tmp_path, "alone", {"reference.py": "def ref_kernel(data): ...\n"})
    with pytest.raises(ImportRejected) as info:
        do_import_task(load_task(alone))  # auto, and no eval.py: the trusted harness is all it has
    assert info.value.errors == [
        "problem alone: the trusted harness calls generate_input, ref_kernel, check_implementation from reference.py, "
        "which does not define generate_input, check_implementation; define them in reference.py (or import them "
        "there from one of the task's files), or give the task its own eval.py (config.main, among the files) to "
        "run under the popcorn protocol"]
    broken = write_task(tmp_path, "broken", {"reference.py": "def generate_input(:\n"})
    with pytest.raises(ImportRejected, match=r"problem broken: reference.py does not parse \(line 1: "):
        do_import_task(load_task(broken))
    assert not Problem.objects.exists()


def test_names_a_static_reading_cannot_see_are_accepted(cpu, tmp_path):
    starred = write_task(tmp_path, "starred", {"reference.py": "from helpers import *\n",
                                               "helpers.py": "def generate_input(): ...\n"})
    do_import_task(load_task(starred), harness="kernelbot")
    assert Problem.objects.get().harness == HarnessProtocol.KERNELBOT


def test_the_command_and_the_admin_refuse_it_too(cpu, cross_entropy, admin_client):
    with pytest.raises(CommandError, match="nothing was imported:\n  problem cross_entropy_py: the trusted harness "
                                           "calls .* which does not define generate_input, ref_kernel, "
                                           "check_implementation; keep the task's own eval.py"):
        call_command("import_problems", str(cross_entropy), "--harness", "kernelbot", stdout=io.StringIO())
    response = admin_client.post("/admin/leaderboards/problem/upload/", {
        "archive": zipped(cross_entropy), "harness": "kernelbot", "leaderboard": "ce", "gpus": "CPU"})
    page = response.content.decode()
    assert response.status_code == 400 and "which does not define generate_input, ref_kernel" in page
    assert "--harness popcorn, or auto" in page and not Problem.objects.exists()


def test_cuda_code_on_a_cpu_board_is_refused_with_where_it_asks(cpu, h100, vectorsum):
    task = load_task(vectorsum)
    with pytest.raises(ImportRejected) as info:
        do_import_task(task, leaderboard="vs", gpus=["CPU"])
    assert info.value.errors == [
        f"leaderboard vs: the problem's code asks for a CUDA GPU ({CUDA_LINES}), but its GPU types (CPU) have none, "
        "so every run would fail: choose a GPU type with CUDA (--gpu, or the GPU types field), or make that code fall "
        "back to the CPU (behind torch.cuda.is_available()); pass --force to import it anyway"]
    assert not Leaderboard.objects.exists() and not Problem.objects.exists()

    assert "warning" not in str(do_import_task(task, leaderboard="vs", gpus=["H100"]))
    mixed = do_import_task(task, leaderboard="vs", gpus=["H100", "CPU"])
    assert mixed.lines[-1] == f"warning: leaderboard vs: runs on CPU will fail: the problem's code asks for a CUDA " \
                              f"GPU ({CUDA_LINES}) and CPU has none"
    forced = do_import_task(task, leaderboard="vs", gpus=["CPU"], force=True)
    assert forced.lines[-1].startswith("warning: leaderboard vs: runs on CPU will fail")
    assert [g.name for g in Leaderboard.objects.get(name="vs").gpu_types.all()] == ["CPU"]


def test_a_popcorn_task_is_read_from_its_own_eval_py(cpu, tmp_path):
    task_dir = write_task(tmp_path, "timed", {"reference.py": CUDA_REFERENCE.replace('"cuda"', "'cpu'"),
                                              "utils.py": "", "eval.py": "import reference\nimport torch\n\n"
                                              "torch.cuda.synchronize()\n"}, main="eval.py")
    with pytest.raises(ImportRejected, match=r"asks for a CUDA GPU \(eval.py line 4: torch.cuda.synchronize\(\)\)"):
        do_import_task(load_task(task_dir), leaderboard="timed", gpus=["CPU"])


def test_the_command_refuses_cuda_on_cpu(cpu, vectorsum):
    with pytest.raises(CommandError, match=r"leaderboard vs: the problem's code asks for a CUDA GPU \(reference.py "
                                           r"line 5: .*but its GPU types \(CPU\) have none.*pass --force"):
        call_command("import_problems", str(vectorsum), "--gpu", "CPU", "--leaderboard", "vs", stdout=io.StringIO())


def test_the_demo_problems_still_import_onto_cpu_without_a_warning(cpu):
    out = io.StringIO()
    call_command("import_problems", str(REPO / "problems" / "demo.yaml"), stdout=out)
    assert "warning" not in out.getvalue() and Leaderboard.objects.count() == 4
    do_import_task(load_task(DEMO / "vectoradd_eval_py"), leaderboard="va-eval", gpus=["CPU"])  # popcorn: eval.py
    assert all(not board.cuda_warning for board in Leaderboard.objects.all())


def test_the_admin_upload_refuses_cuda_on_cpu_and_warns_when_forced(cpu, vectorsum, admin_client):
    form = {"harness": "auto", "leaderboard": "vs", "deadline": "2030-01-01 00:00", "gpus": "CPU"}
    response = admin_client.post("/admin/leaderboards/problem/upload/", {**form, "archive": zipped(vectorsum)})
    page = response.content.decode()
    assert response.status_code == 400 and "asks for a CUDA GPU (reference.py line 5" in page
    assert "tick “Force” below to import it anyway" in page and not Leaderboard.objects.exists()
    response = admin_client.post("/admin/leaderboards/problem/upload/",
                                 {**form, "archive": zipped(vectorsum), "force": "on"}, follow=True)
    assert response.status_code == 200 and Leaderboard.objects.filter(name="vs").exists()
    warnings = [m.message for m in response.context["messages"] if m.level_tag == "warning"]
    assert any("Warning: leaderboard vs: runs on CPU will fail" in str(m) for m in warnings)


def test_the_board_page_and_the_admin_warn_about_an_existing_board(cpu, h100, vectorsum, client, admin_client):
    board = LeaderboardFactory(name="vs", problem=problem_from(load_task(vectorsum)), gpu_types=[cpu, h100])
    warning = f"Runs on CPU will fail: the problem's code asks for a CUDA GPU ({CUDA_LINES}) and CPU has none."
    assert board.cuda_warning == warning
    page = client.get("/lb/vs/").content.decode()
    assert 'id="cuda-warning"' in page and "Runs on CPU will fail" in page and "reference.py line 5" in page

    changelist = admin_client.get("/admin/leaderboards/leaderboard/").content.decode()
    assert "⚠ needs CUDA" in changelist
    change = admin_client.get(f"/admin/leaderboards/leaderboard/{board.pk}/change/")
    assert any(str(m.message).startswith(warning + " Add a GPU type with CUDA below")
               for m in change.context["messages"])

    board.gpu_types.set([h100])
    board = Leaderboard.objects.get(pk=board.pk)
    assert board.cuda_warning == "" and 'id="cuda-warning"' not in client.get("/lb/vs/").content.decode()
    assert "⚠ needs CUDA" not in admin_client.get("/admin/leaderboards/leaderboard/").content.decode()


def test_a_cpu_problem_on_a_cpu_board_has_no_warning(leaderboard, client):
    assert leaderboard.cuda_warning == ""
    assert 'id="cuda-warning"' not in client.get(f"/lb/{leaderboard.name}/").content.decode()
