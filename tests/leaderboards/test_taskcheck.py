"""The static reading of a task's code (leaderboards.taskcheck): nothing here imports or runs the code it reads."""

import pytest

from leaderboards.taskcheck import CudaRequest, cuda_requests, describe, missing_trusted_names
from taskspec.loader import load_task

from ..conftest import REPO

ALL_THREE = ["generate_input", "ref_kernel", "check_implementation"]


@pytest.mark.parametrize(("reference", "missing"), [
    ("def generate_input(size, seed): ...\ndef ref_kernel(data): ...\ndef check_implementation(data, out): ...\n",
     []),
    # princeton/cross_entropy_py: written for its own eval.py
    ("DEVICE = 'cuda'\ndef reference_forward(logits, targets): ...\ndef generate_inputs(b, v, seed=42): ...\n",
     ALL_THREE),
    # KernelBot's examples/gather: no ref_kernel
    ("def generate_input(seed, world_size, rank): ...\ndef check_implementation(data, output): ...\n",
     ["ref_kernel"]),
    # pmpp_v2: the checker built from a helper of the task's utils.py
    ("from utils import make_match_reference\ndef ref_kernel(data): ...\ndef generate_input(size, seed): ...\n"
     "check_implementation = make_match_reference(ref_kernel)\n", []),
    ("from utils import check_implementation, generate_input as generate_input\nimport kernels\n"
     "ref_kernel = kernels.ref\n", []),
    ("from utils import *\n", []),  # cannot be known without running it: accepted
    ("def __getattr__(name): ...\n", []),
    ("globals()['generate_input'] = print\n", []),
    ("try:\n    from fast import ref_kernel\nexcept ImportError:\n    def ref_kernel(data): ...\n"
     "if True:\n    class generate_input: ...\nelse:\n    pass\n"
     "with open('x') as check_implementation: pass\n", []),
    ("def generate_input(size, seed):\n    def ref_kernel(data): ...\n    return ref_kernel\n"
     "check_implementation: object\n", ["ref_kernel", "check_implementation"]),
    ("class Checks:\n    def check_implementation(self): ...\n"
     "def generate_input(): ...\ndef setup():\n    global ref_kernel\n    ref_kernel = print\n",
     ["check_implementation"]),
])
def test_the_names_the_trusted_harness_calls(reference, missing):
    assert missing_trusted_names(reference) == missing


def test_an_unparsable_reference_says_where():
    with pytest.raises(SyntaxError) as info:
        missing_trusted_names("def generate_input(:\n")
    assert info.value.lineno == 1


GUARDED = """import torch
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
torch.cuda.manual_seed_all(0)
if torch.cuda.is_available():
    x = torch.zeros(1).cuda()
    torch.cuda.synchronize()
def move(t):
    if t.device.type == "cuda":
        return t.to("cuda:0")
    try:
        return t.cuda()
    except RuntimeError:
        return t
name = "cudnn" if torch.backends.cudnn.enabled else "cuda-less"
use = torch.cuda.is_available() and torch.cuda.get_device_name()
"""


@pytest.mark.parametrize(("code", "lines"), [
    (GUARDED, []),
    ('gen = torch.Generator(device="cuda")\n', [1]),
    ("DEVICE = 'cuda'\nx = torch.empty(1, device=DEVICE)\n", [1]),
    ("x = torch.empty(1)\ny = x.cuda()\n", [2]),
    ("torch.cuda.synchronize()\nstart = torch.cuda.Event(enable_timing=True)\n", [1, 2]),
    ('local = torch.tensor([rank]).to(f"cuda:{rank}")\n', [1]),
    ("x = torch.ones(1, device='cuda:1')\ny = torch.ones(1, device=f'cpu:{0}')\n", [1]),
    ("try:\n    pass\nfinally:\n    torch.cuda.synchronize()\n", [4]),
])
def test_where_code_asks_for_cuda(code, lines):
    found = cuda_requests({"reference.py": code}, "py", "reference.py")
    assert [r.line for r in found] == lines and all(r.file == "reference.py" for r in found)


def test_only_the_files_the_entry_imports_are_read():
    files = {"reference.py": "from utils import helper\nimport torch\n",
             "utils.py": "def helper():\n    return torch.empty(1).cuda()\n",
             "eval.py": "import reference\ntorch.cuda.synchronize()\n",
             "notes.py": "device = 'cuda'\n"}
    assert cuda_requests(files, "py", "reference.py") == [CudaRequest("utils.py", 2, "return torch.empty(1).cuda()")]
    assert [str(r) for r in cuda_requests(files, "py", "eval.py")] == [
        "eval.py line 2: torch.cuda.synchronize()", "utils.py line 2: return torch.empty(1).cuda()"]
    assert cuda_requests(files, "cu", "eval.cu") == [
        CudaRequest("task.yml", 0, "lang: cu (compiled with nvcc for a CUDA GPU)")]


def test_describe_names_the_first_places():
    requests = [CudaRequest("reference.py", n, f"line{n}()") for n in (3, 5, 9)]
    assert describe(requests) == "reference.py line 3: line3(); reference.py line 5: line5() (and 1 more)"


@pytest.mark.parametrize("task_dir", sorted({p.parent for p in (REPO / "problems").rglob("task.yml")}
                                            | {REPO / "leaderboards" / "health_check"}), ids=lambda p: p.name)
def test_the_repositorys_cpu_problems_ask_for_no_cuda(task_dir):
    """The demo problems pick their device with torch.cuda.is_available(): they run on a CPU board."""
    task = load_task(task_dir)
    assert missing_trusted_names(task.files["reference.py"]) == []
    for entry in ("reference.py", task.main):
        assert cuda_requests(task.files, task.lang, entry) == []
