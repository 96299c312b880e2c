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
from .test_importing import collection

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
    # issue 43: the form's words, not the command line's ("--harness popcorn")
    assert "as Harness, or auto" in page and "--harness" not in page and not Problem.objects.exists()


def test_cuda_code_on_a_cpu_board_is_refused_with_where_it_asks(cpu, h100, vectorsum):
    task = load_task(vectorsum)
    with pytest.raises(ImportRejected) as info:
        do_import_task(task, leaderboard="vs", gpus=["CPU"])
    assert info.value.errors == [
        f"leaderboard vs: the problem's code asks for a CUDA GPU ({CUDA_LINES}), but its GPU types (CPU) have none, "
        "so every run would fail: choose a GPU type with CUDA (--gpu), or make that code fall back to the CPU (behind "
        "torch.cuda.is_available()); pass --force to import it anyway"]
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
                                              "utils.py": "def match_reference(*a): ...\n",
                                              "eval.py": "import reference\nimport torch\n\n"
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


# Issue 43: what a run will need, per protocol, checked at import
TRUSTED_REFERENCE = CUDA_REFERENCE.replace('"cuda"', '"cpu"')
PHASED_EVAL = """import sys
import torch
from reference import generate_input, check_implementation
from submission import custom_kernel

def run_testing():
    return check_implementation(generate_input(8, 1), custom_kernel(generate_input(8, 1)))

def time_one():
    torch.cuda.synchronize()

def run_benchmarking():
    return time_one()

def main():
    mode = sys.argv[1]
    if mode == "test":
        return run_testing()
    if mode == "benchmark":
        return run_benchmarking()
    if mode == "leaderboard":
        run_testing()
        return run_benchmarking()

main()
"""


def test_a_popcorn_eval_importing_a_name_its_files_lack_is_refused(cpu, tmp_path):
    """Under auto (popcorn protocol) a task whose eval.py imports a function its reference does not define was
    accepted and every run crashed, charged to the competitor."""
    eval_py = "from reference import generate_input, check_implementation\nfrom submission import custom_kernel\n"
    task_dir = write_task(tmp_path, "lacking", {"reference.py": "def generate_input(size, seed): ...\n",
                                                "eval.py": eval_py}, main="eval.py")
    with pytest.raises(ImportRejected) as info:
        do_import_task(load_task(task_dir), leaderboard="lacking", gpus=["CPU"])
    assert info.value.errors == [
        "problem lacking: eval.py line 1 imports check_implementation from reference.py, which does not define it; "
        "every run would crash there (the popcorn protocol runs the task's own eval.py)"]
    assert not Problem.objects.exists()
    with pytest.raises(CommandError, match="eval.py line 1 imports check_implementation from reference.py"):
        call_command("import_problems", str(task_dir), stdout=io.StringIO())
    fine = write_task(tmp_path, "fine", {"reference.py": TRUSTED_REFERENCE, "utils.py": "def match_reference(): ...\n",
                                         "eval.py": eval_py}, main="eval.py")
    do_import_task(load_task(fine), leaderboard="fine", gpus=["CPU"])  # the submission's names are the competitor's
    assert Problem.objects.get().harness == HarnessProtocol.POPCORN


def test_multi_gpu_only_under_a_protocol_that_runs_it(cpu, h100, tmp_path):
    task_dir = write_task(tmp_path, "gather", {"reference.py": TRUSTED_REFERENCE, "utils.py":
                                               "def match_reference(): ...\n", "eval.py": PHASED_EVAL})
    yml = task_dir / "task.yml"
    yml.write_text(yml.read_text().replace("seed: 1}", "seed: 1, world_size: 2}").replace(
        "seed: 2}", "seed: 2, world_size: 2}") + "multi_gpu: true\n")
    with pytest.raises(ImportRejected) as info:
        do_import_task(load_task(task_dir), leaderboard="gather", gpus=["H100"])  # auto: no config.main
    assert info.value.errors == [
        "problem gather: multi_gpu: the trusted harness runs one device per run and never reads world_size, so every "
        "run would fail; run it under its own eval.py (config.main, among the files: --harness popcorn), or drop "
        "multi_gpu"]
    yml.write_text(yml.read_text() + 'config:\n  main: "eval.py"\n')
    do_import_task(load_task(task_dir), leaderboard="gather", gpus=["H100"])
    assert Problem.objects.get().harness == HarnessProtocol.POPCORN


def test_a_past_deadline_is_refused_unless_asked_for(cpu, tmp_path):
    """import_problems --deadline in the past (and a competition file's past deadline) silently created closed
    boards, where the admin's zip form asks first."""
    with pytest.raises(CommandError, match=r"leaderboard va: deadline 2020-01-01 00:00 UTC is in the past: the "
                                           r"leaderboard would be closed at once; correct it, or pass --past-deadline"):
        call_command("import_problems", str(DEMO / "vectoradd_py"), "--leaderboard", "va", "--deadline",
                     "2020-01-01", "--gpu", "CPU", stdout=io.StringIO())
    assert not Leaderboard.objects.exists()
    call_command("import_problems", str(DEMO / "vectoradd_py"), "--leaderboard", "va", "--deadline", "2020-01-01",
                 "--gpu", "CPU", "--past-deadline", stdout=io.StringIO())
    assert not Leaderboard.objects.get(name="va").is_open
    do_import_task(load_task(DEMO / "vectoradd_py"), leaderboard="va", deadline=Leaderboard.objects.get().deadline)
    # the deadline it has already: nothing to ask

    competition = collection(tmp_path, competition='name: Old\ndeadline: "2021-06-01"\nproblems:\n'
                             '  - {directory: vectoradd_py, name: old-va, gpus: [CPU]}\n') / "set.yaml"
    with pytest.raises(CommandError, match="leaderboard old-va: deadline 2021-06-01 00:00 UTC is in the past"):
        call_command("import_problems", str(competition), stdout=io.StringIO())
    call_command("import_problems", str(competition), "--past-deadline", stdout=io.StringIO())
    assert not Leaderboard.objects.get(name="old-va").is_open


def test_the_admin_form_words_its_refusals_as_the_form(cpu, h100, tmp_path, admin_client):
    task_dir = write_task(tmp_path, "gather", {"reference.py": TRUSTED_REFERENCE, "utils.py":
                                               "def match_reference(): ...\n"})
    yml = task_dir / "task.yml"
    yml.write_text(yml.read_text().replace("seed: 1}", "seed: 1, world_size: 2}").replace(
        "seed: 2}", "seed: 2, world_size: 2}") + "multi_gpu: true\n")
    response = admin_client.post("/admin/leaderboards/problem/upload/", {
        "archive": zipped(task_dir), "harness": "auto", "leaderboard": "gather", "gpus": "H100"})
    page = response.content.decode()
    assert response.status_code == 400 and "multi_gpu: the trusted harness runs one device per run" in page
    assert "choose “Problem&#x27;s own eval.py (reference-kernels protocol)” as Harness" in page
    assert "--harness" not in page and "--gpu" not in page


def test_the_cuda_warning_names_the_modes_that_need_it(cpu, h100, tmp_path):
    """"runs on CPU will fail" was said when only the benchmark path needs CUDA: the tests pass there."""
    task_dir = write_task(tmp_path, "phased", {"reference.py": TRUSTED_REFERENCE, "utils.py":
                                               "def match_reference(): ...\n", "eval.py": PHASED_EVAL},
                          main="eval.py")
    report = do_import_task(load_task(task_dir), leaderboard="phased", gpus=["H100", "CPU"])
    assert report.lines[-1] == ("warning: leaderboard phased: benchmark, leaderboard and profile runs on CPU will "
                                "fail: the problem's code asks for a CUDA GPU (eval.py line 10: "
                                "torch.cuda.synchronize()) and CPU has none")  # profile: no branch, so not known
    assert Leaderboard.objects.get().cuda_warning.startswith("Benchmark, leaderboard and profile runs on CPU will")
    with pytest.raises(ImportRejected, match=r"have none, so every benchmark, leaderboard and profile run would fail"):
        do_import_task(load_task(task_dir), leaderboard="phased-cpu", gpus=["CPU"])
    everywhere = write_task(tmp_path, "everywhere", {"reference.py": TRUSTED_REFERENCE, "utils.py": "def "
                            "match_reference(): ...\n", "eval.py": PHASED_EVAL.replace(
                                "def run_testing():\n", "def run_testing():\n    torch.cuda.synchronize()\n")},
                            main="eval.py")
    report = do_import_task(load_task(everywhere), leaderboard="everywhere", gpus=["H100", "CPU"])
    assert report.lines[-1].startswith("warning: leaderboard everywhere: runs on CPU will fail: ")
