import io
import json
import stat
import zipfile
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
import yaml

from leaderboards.models import Competition, Leaderboard, Problem
from taskspec.loader import (
    CompetitionError,
    TaskFileError,
    collection_root,
    load_competition,
    load_task,
    load_task_from_zip,
)
from taskspec.model import (
    MAX_COMPETITION_NAME,
    MAX_LEADERBOARD_NAME,
    MAX_PROBLEM_NAME,
    TaskDefinition,
    case_line,
    parse_deadline,
)

TASK = {
    "files": [
        {"name": "submission.py", "source": "@SUBMISSION@"},
        {"name": "task.py", "source": "task.py"},
        {"name": "utils.py", "source": "../utils.py"},
        {"name": "eval.py", "source": "../eval.py"},
    ],
    "lang": "py",
    "description": "Softmax over the last dimension.",
    "config": {"main": "eval.py"},
    "templates": {"Python": "template.py"},
    "tests": [{"size": 128, "seed": 4242}, {"size": 1024, "seed": 5236, "dtype": "fp16"}],
    "benchmarks": [{"size": 8192, "seed": 1}],
    "ranking_by": "geom",
}
FILES = {"softmax_py/task.py": "TASK = 1\n", "utils.py": "UTILS = 1\n", "eval.py": "EVAL = 1\n",
         "softmax_py/template.py": "def custom_kernel(data): ...\n"}
CU_TASK = {
    "files": [{"name": "submission.cu", "source": "@SUBMISSION@"}, {"name": "eval.cu", "source": "eval.cu"}],
    "lang": "cu",
    "description": "Vector add.",
    "config": {"sources": ["eval.cu", "submission.cu"], "defines": {"N": 4096}},
    "tests": [{"size": 1}],
    "benchmarks": [{"size": 2}],
}


def write_tree(base: Path, task: dict | str = TASK, files: dict[str, str | bytes] = FILES,
               name: str = "softmax_py") -> Path:
    """Write a problem set `base/demo` holding one task `name`; returns the task dir."""
    task_dir = base / "demo" / name
    task_dir.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = base / "demo" / rel.replace("softmax_py/", f"{name}/", 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    text = task if isinstance(task, str) else yaml.safe_dump(task, sort_keys=False)
    (task_dir / "task.yml").write_text(text)
    return task_dir


def changed(**changes) -> dict:
    """TASK with top-level keys replaced; a value of ... deletes the key."""
    task = json.loads(json.dumps(TASK))
    for key, value in changes.items():
        if value is ...:
            del task[key]
        else:
            task[key] = value
    return task


def with_file(entry: dict) -> dict:
    return changed(files=[*TASK["files"], entry])


def multi_gpu(case: dict) -> dict:
    return changed(multi_gpu=True, tests=[case], benchmarks=[{"world_size": 2}])


BAD_TASKS = [
    ("files:\n  - [oops\nlang: py\n", None, "invalid YAML at line 2, column 5: a flow sequence that is never closed"),
    ("lang: py\ndescription: 'unclosed\nfiles: []\n\n", None, "invalid YAML at line 2, column 14: a quoted scalar"),
    ("- a\n- list\n", None, "expected a mapping at the top level, got list"),
    ("lang: py\nlang: cu\n", None, "found duplicate key 'lang'"),
    ("", None, "expected a mapping at the top level, got null"),
    (changed(lang=...), "lang", "required key is missing"),
    (changed(tests=...), "tests", "required key is missing"),
    (changed(lang="rust"), "lang", "expected one of py, cu, got str 'rust'"),
    (changed(description=" "), "description", "expected a non-empty string"),
    (changed(description=3), "description", "expected a non-empty string, got int 3"),
    (changed(colour="red"), "colour", "unknown key; expected one of benchmark_timeout"),
    (changed(test_timeout=True), "test_timeout", "expected a positive int of seconds up to 86400 (24 h), got bool"),
    (changed(benchmark_timeout=0), "benchmark_timeout", "expected a positive int of seconds up to 86400"),
    (changed(test_timeout=10**29), "test_timeout", "up to 86400 (24 h), got int 1000000"),
    (changed(ranked_timeout="60"), "ranked_timeout", "got str '60'"),
    (changed(ranking_by="median"), "ranking_by", "expected one of last, mean, geom, got str 'median'"),
    (changed(seed=1.5), "seed", "expected int, got float"),
    (changed(seed=False), "seed", "expected int, got bool"),
    (changed(multi_gpu="yes"), "multi_gpu", "expected true or false, got str"),
    (changed(gpus="H100"), "gpus", "expected a list of non-empty strings, got str 'H100'"),
    (changed(tests=[]), "tests", "expected a non-empty list of cases, got list"),
    (changed(benchmarks={"size": 1}), "benchmarks", "expected a non-empty list of cases, got mapping"),
    (changed(tests=[{"size": 1}, {"size": None}]), "tests[1].size",
     "expected int, str, bool or a list of them, got null"),
    (changed(tests=[{"size": 1.5}]), "tests[0].size", "expected int, str, bool or a list of them, got float"),
    (changed(tests=[{"m": [[1, 2]]}]), "tests[0].m", "list item: expected int, str or bool, got list"),
    (changed(tests=[{"m": {"a": 1}}]), "tests[0].m", "got mapping"),
    (changed(tests=[{"m": ["a;b"]}]), "tests[0].m", "list item: string 'a;b' may only contain"),
    (changed(tests=[{"dtype": "fp16; x: 1"}]), "tests[0].dtype", "may only contain letters, digits and _.+-"),
    (changed(tests=[{"dtype": "a\nb"}]), "tests[0].dtype", "may only contain"),
    (changed(benchmarks=[{"bad-key": 1}]), "benchmarks[0]", "parameter name str 'bad-key' is not an"),
    (changed(tests=[{}]), "tests[0]", "expected a non-empty mapping of parameters, got mapping"),
    (changed(tests=["size: 1"]), "tests[0]", "expected a non-empty mapping of parameters, got str"),
    (multi_gpu({"size": 1}), "tests[0].world_size", "multi_gpu needs an int >= 1 in every case, missing"),
    (multi_gpu({"world_size": 0}), "tests[0].world_size", "int >= 1 in every case, got int 0"),
    (multi_gpu({"world_size": "2"}), "tests[0].world_size", "got str '2'"),
    (changed(files="task.py"), "files", "expected a non-empty list of {name, source}, got str"),
    (changed(files=TASK["files"][1:]), "files", "no entry has source @SUBMISSION@"),
    (with_file({"name": "s.py", "source": "@SUBMISSION@"}), "files[4].source", "more than one @SUBMISSION@"),
    (with_file({"name": "task.py", "source": "task.py"}), "files[4].name", "duplicate file name task.py"),
    (with_file({"name": "../x.py", "source": "task.py"}), "files[4].name", "expected a plain file name"),
    (with_file({"name": "ref/reference.py", "source": "task.py"}), "files[4].name",
     "expected a plain file name like eval.py (no directory), got str 'ref/reference.py'"),
    (with_file({"name": "x.py", "source": "x.py", "mode": 1}), "files[4].mode", "unknown key"),
    (with_file({"name": "x.py"}), "files[4].source", "required key is missing"),
    (with_file({"name": "x.py", "source": "x.py"}), "files[4].source", "file not found: x.py"),
    (with_file({"name": "x.py", "source": "/etc/passwd"}), "files[4].source", "absolute paths"),
    (with_file({"name": "x.py", "source": "../../outside.py"}), "files[4].source",
     "../../outside.py resolves outside the problem collection; files may come from anywhere inside the "
     "problem collection demo/ (pass --root with a directory that holds both the task and the file)"),
    (with_file({"name": "x.py", "source": "../../../../etc/passwd"}), "files[4].source", "resolves outside"),
    (with_file({"name": "x.py", "source": "."}), "files[4].source", ". is a directory, not a file"),
    (with_file({"name": "x.py", "source": 7}), "files[4].source", "expected a relative path, got int"),
    (changed(config={"main": "eval.py", "sources": []}), "config.sources", "unknown key; expected one of"),
    (changed(config=["eval.py"]), "config", "expected a mapping, got list"),
    (changed(templates={"Rust": "template.py"}), "templates.Rust", "unknown language"),
    (changed(templates={"Python": "missing.py"}), "templates.Python", "file not found: missing.py"),
    (changed(templates="template.py"), "templates", "expected a mapping of language to path"),
    ({**CU_TASK, "config": ...}, "config", "required for cu tasks"),
    ({**CU_TASK, "config": {"sources": ["main.cu"]}}, "config.sources[0]", "main.cu is not one of the files"),
    ({**CU_TASK, "config": {"sources": []}}, "config.sources", "must list at least one file"),
    ({**CU_TASK, "config": {"sources": ["eval.cu"], "defines": {"N": True}}}, "config.defines.N",
     "expected str or int, got bool"),
    ({**CU_TASK, "config": {"sources": ["eval.cu"], "compile_flags": "-O3"}}, "config.compile_flags",
     "expected a list of non-empty strings"),
]


@pytest.mark.parametrize(("task", "key", "fragment"), BAD_TASKS)
def test_malformed_task_reports_key_and_message(tmp_path, task, key, fragment):
    if isinstance(task, dict):
        task = {k: v for k, v in task.items() if v is not ...}
    files = {**FILES, "softmax_py/eval.cu": "int main() {}\n"}
    task_dir = write_tree(tmp_path, task, files)
    with pytest.raises(TaskFileError) as info:
        load_task(task_dir)
    matching = [issue for issue in info.value.issues if issue.key == key and fragment in issue.message]
    assert matching, info.value.errors
    assert all(str(issue).startswith("demo/softmax_py/task.yml: ") for issue in info.value.issues)


def test_error_message_names_file_key_and_problem(tmp_path):
    task = changed(tests=[{"seed": 1}, {"seed": 2}, {"seed": None}])
    with pytest.raises(TaskFileError) as info:
        load_task(write_tree(tmp_path, task))
    err = info.value
    assert isinstance(err, ValueError)
    assert err.path == Path("demo/softmax_py/task.yml")
    assert (err.key, err.problem) == ("tests[2].seed", "softmax_py")
    assert str(err) == ("demo/softmax_py/task.yml: tests[2].seed: expected int, str, bool or a list of them, "
                        "got null (problem softmax_py)")


def test_yaml_empty_value_in_flow_mapping_names_the_case(tmp_path):
    text = yaml.safe_dump(changed(tests=...), sort_keys=False) + 'tests:\n  - {"size": 1, "seed":}\n'
    with pytest.raises(TaskFileError) as info:
        load_task(write_tree(tmp_path, text))
    assert info.value.key == "tests[0].seed"


def test_all_errors_of_a_file_are_collected(tmp_path):
    task = changed(lang="rust", test_timeout=-1, benchmarks=[{"n": None}], colour="red")
    with pytest.raises(TaskFileError) as info:
        load_task(write_tree(tmp_path, task))
    assert {issue.key for issue in info.value.issues} == {"lang", "test_timeout", "benchmarks[0].n", "colour"}
    assert len(str(info.value).splitlines()) == 4


def test_template_keyed_by_a_number_is_reported_beside_other_errors(tmp_path):
    """Ordering the issues of a template mapping keyed by a number (YAML `1:`) used to raise a TypeError."""
    with pytest.raises(TaskFileError) as info:
        load_task(write_tree(tmp_path, changed(templates={1: "template.py", "HIP": 3})))
    assert [(issue.key, issue.message) for issue in info.value.issues] == [
        ("templates.1", "unknown language; expected Python, Triton, CUDA, HIP, CuteDSL"),
        ("templates.HIP", "expected a relative path, got int")]


def test_loads_python_task(tmp_path):
    task = load_task(write_tree(tmp_path))
    assert task.name == "softmax_py"
    assert task.lang == "py"
    assert task.submission_name == "submission.py"
    assert task.files == {"task.py": "TASK = 1\n", "utils.py": "UTILS = 1\n", "eval.py": "EVAL = 1\n"}
    assert (task.main, task.config) == ("eval.py", {"main": "eval.py"})
    assert task.templates == {"Python": "def custom_kernel(data): ...\n"}
    assert task.tests[1] == {"size": 1024, "seed": 5236, "dtype": "fp16"}
    assert task.ranking_by == "geom"
    assert (task.test_timeout, task.benchmark_timeout, task.ranked_timeout) == (180, 180, 180)
    assert (task.seed, task.multi_gpu, task.gpus) == (None, False, [])
    assert len(task.content_hash) == 64


def test_python_task_without_config_runs_under_trusted_harness(tmp_path):
    task = load_task(write_tree(tmp_path, changed(config=...)))
    assert (task.main, task.config) == (None, {})


def test_loads_cuda_task_with_config_defaults(tmp_path):
    task = load_task(write_tree(tmp_path, CU_TASK, {"softmax_py/eval.cu": "int main() {}\n"}))
    assert task.submission_name == "submission.cu"
    assert task.main is None
    assert task.config == {
        "sources": ["eval.cu", "submission.cu"], "include_dirs": [], "defines": {"N": 4096},
        "compile_flags": [],
    }


def test_multi_gpu_task(tmp_path):
    task = load_task(write_tree(tmp_path, multi_gpu({"world_size": 8, "seed": 3})))
    assert task.multi_gpu
    assert task.tests == [{"world_size": 8, "seed": 3}]


def test_json_round_trip(tmp_path):
    task = load_task(write_tree(tmp_path, changed(seed=7, gpus=["H100", "B200"], test_timeout=60)))
    data = json.loads(json.dumps(task.to_json()))
    assert data["content_hash"] == task.content_hash
    assert TaskDefinition.from_json(data) == task


def test_case_line():
    assert case_line({"size": 1024, "seed": 5236, "dtype": "fp16"}) == "size: 1024; seed: 5236; dtype: fp16"


def test_hash_ignores_ordering_description_and_templates(tmp_path):
    base = load_task(write_tree(tmp_path / "a")).content_hash
    reordered = dict(reversed(list(TASK.items())))
    reordered["tests"] = [dict(reversed(list(case.items()))) for case in TASK["tests"]]
    reordered["description"] = "Something else entirely."
    files = {**FILES, "softmax_py/template.py": "# another template\n"}
    assert load_task(write_tree(tmp_path / "b", reordered, files)).content_hash == base


@pytest.mark.parametrize("change", [
    {"benchmarks": [{"size": 8193, "seed": 1}]},
    {"tests": TASK["tests"][:1]},
    {"ranking_by": "mean"},
    {"ranked_timeout": 181},
    {"seed": 1},
    {"config": ...},
])
def test_hash_changes_with_evaluation_inputs(tmp_path, change):
    base = load_task(write_tree(tmp_path / "a")).content_hash
    assert load_task(write_tree(tmp_path / "b", changed(**change))).content_hash != base


def test_hash_changes_with_file_content(tmp_path):
    base = load_task(write_tree(tmp_path / "a")).content_hash
    edited = load_task(write_tree(tmp_path / "b", files={**FILES, "utils.py": "UTILS = 2\n"}))
    assert edited.content_hash != base


def test_root_confines_shared_files(tmp_path):
    task_dir = write_tree(tmp_path)
    with pytest.raises(TaskFileError) as info:
        load_task(task_dir, root=task_dir)
    assert [issue.key for issue in info.value.issues] == ["files[2].source", "files[3].source"]
    assert "../utils.py resolves outside the problem collection" in str(info.value)


def test_symlink_escaping_root_is_rejected(tmp_path):
    (tmp_path / "secret.py").write_text("SECRET = 1\n")
    task_dir = write_tree(tmp_path)
    (task_dir / "task.py").unlink()
    (task_dir / "task.py").symlink_to(tmp_path / "secret.py")
    with pytest.raises(TaskFileError) as info:
        load_task(task_dir)
    assert info.value.key == "files[1].source"
    assert "task.py resolves outside the problem collection" in str(info.value)


def test_symlink_inside_root_is_followed(tmp_path):
    task_dir = write_tree(tmp_path)
    (task_dir / "task.py").unlink()
    (task_dir / "task.py").symlink_to(task_dir.parent / "utils.py")
    assert load_task(task_dir).files["task.py"] == "UTILS = 1\n"


def test_non_utf8_file_is_named(tmp_path):
    task_dir = write_tree(tmp_path, files={**FILES, "utils.py": b"x = '\xff'\n"})
    with pytest.raises(TaskFileError) as info:
        load_task(task_dir)
    assert info.value.key == "files[2].source"
    assert "../utils.py is not valid UTF-8 (byte 0xff at offset 5)" in str(info.value)


def test_non_utf8_task_yml(tmp_path):
    task_dir = write_tree(tmp_path)
    (task_dir / "task.yml").write_bytes(b"description: caf\xe9\n")
    with pytest.raises(TaskFileError) as info:
        load_task(task_dir)
    assert info.value.key is None
    assert "task.yml is not valid UTF-8" in str(info.value)


def test_missing_task_yml(tmp_path):
    (tmp_path / "demo" / "empty").mkdir(parents=True)
    with pytest.raises(TaskFileError, match="file not found: task.yml"):
        load_task(tmp_path / "demo" / "empty")


def test_file_over_1_mib_is_rejected(tmp_path):
    task_dir = write_tree(tmp_path, files={**FILES, "utils.py": "#" * ((1 << 20) + 1)})
    with pytest.raises(TaskFileError) as info:
        load_task(task_dir)
    assert info.value.key == "files[2].source"
    assert "../utils.py is larger than the 1 MiB limit" in str(info.value)


def test_total_over_8_mib_is_rejected(tmp_path):
    big = {f"softmax_py/big{i}.py": "#" * (1 << 20) for i in range(9)}
    entries = [{"name": f"big{i}.py", "source": f"big{i}.py"} for i in range(9)]
    task = changed(files=[*TASK["files"], *entries])
    with pytest.raises(TaskFileError) as info:
        load_task(write_tree(tmp_path, task, {**FILES, **big}))
    assert "past 8 MiB in total" in str(info.value)


def make_zip(members: dict[str, str | bytes], symlinks: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in members.items():
            archive.writestr(name, content)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, target)
    return buffer.getvalue()


def zipped_tree(prefix: str = "") -> dict[str, str]:
    tree = {**FILES, "softmax_py/task.yml": yaml.safe_dump(TASK)}
    return {prefix + rel: text for rel, text in tree.items()}


def test_zip_with_task_in_a_folder_and_shared_files(tmp_path):
    task = load_task_from_zip(make_zip(zipped_tree()))
    assert task.name == "softmax_py"
    assert task.content_hash == load_task(write_tree(tmp_path)).content_hash


def test_zip_with_task_at_top_level():
    members = {"task.yml": yaml.safe_dump(changed(files=TASK["files"][:2], config=..., templates=...)),
               "task.py": "TASK = 1\n"}
    task = load_task_from_zip(make_zip(members), name="softmax_py")
    assert (task.name, task.files) == ("softmax_py", {"task.py": "TASK = 1\n"})


def test_zip_errors_name_the_archive():
    members = {"softmax_py/task.yml": yaml.safe_dump(changed(lang="rust"))}
    with pytest.raises(TaskFileError) as info:
        load_task_from_zip(make_zip(members))
    assert str(info.value.path) == "upload.zip/softmax_py/task.yml"


@pytest.mark.parametrize(("members", "symlinks", "fragment"), [
    ({"../evil.py": "x", **zipped_tree()}, None, "unsafe member path '../evil.py'"),
    ({"softmax_py/../../evil.py": "x"}, None, "unsafe member path"),
    ({"/etc/evil.py": "x"}, None, "unsafe member path '/etc/evil.py'"),
    ({"..\\evil.py": "x"}, None, "unsafe member path"),
    (zipped_tree(), {"softmax_py/link.py": "/etc/passwd"}, "member 'softmax_py/link.py' is a symlink"),
    ({f"f{i}.txt": "" for i in range(201)}, None, "201 members; the limit is 200"),
    ({"bomb.bin": b"\0" * (17 << 20)}, None, "uncompressed size exceeds the 16 MiB limit"),
    ({"softmax_py/README": "no task"}, None, "exactly one task.yml, found none"),
    ({**zipped_tree(), **zipped_tree("copy/")}, None, "exactly one task.yml, found copy/softmax_py/task.yml"),
])
def test_unsafe_or_invalid_zip_is_rejected(members, symlinks, fragment):
    with pytest.raises(TaskFileError) as info:
        load_task_from_zip(make_zip(members, symlinks))
    assert fragment in str(info.value)


def test_not_a_zip():
    with pytest.raises(TaskFileError, match="not a valid zip archive"):
        load_task_from_zip(b"PK\x03\x04 nope")


def write_competition(base: Path, competition: dict | str) -> Path:
    path = base / "demo" / "competition.yml"
    path.write_text(competition if isinstance(competition, str) else yaml.safe_dump(competition))
    return path


def test_competition_defaults(tmp_path):
    write_tree(tmp_path, changed(gpus=["H100"]))
    write_tree(tmp_path, name="softmax_v2")
    path = write_competition(tmp_path, {
        "name": "Softmax cup", "description": "", "deadline": "2026-03-01T12:00:00",
        "problems": [
            {"name": "softmax", "directory": "softmax_py"},
            {"name": "softmax-2", "directory": "./softmax_v2", "deadline": "2026-04-01T12:00:00+02:00",
             "gpus": ["B200"], "harness": "popcorn"},
        ],
    })
    competition = load_competition(path)
    assert competition.deadline == datetime(2026, 3, 1, 12, tzinfo=UTC)
    first, second = competition.problems
    assert (first.name, first.task.name, first.deadline, first.gpus, first.harness) == (
        "softmax", "softmax_py", competition.deadline, ["H100"], "auto")
    assert second.deadline == datetime(2026, 4, 1, 10, tzinfo=UTC)
    assert (second.gpus, second.harness) == (["B200"], "popcorn")


def test_competition_collects_errors_across_problems(tmp_path):
    write_tree(tmp_path, changed(lang="rust"))
    write_tree(tmp_path, name="softmax_v2")
    path = write_competition(tmp_path, {
        "name": "Softmax cup", "description": "x", "deadline": "2026-03-01 24:00", "prizes": 3,
        "problems": [
            {"name": "a", "directory": "softmax_py", "gpus": ["H100"]},
            {"name": "b", "directory": "softmax_v2"},
            {"name": "b", "directory": "../outside", "gpus": ["H100"]},
            {"name": "c", "directory": "softmax_v2", "gpus": ["H100"], "harness": "slurm"},
            {"directory": "nowhere", "gpus": ["H100"]},
        ],
    })
    with pytest.raises(CompetitionError) as info:
        load_competition(path)
    got = {(str(issue.path), issue.key, issue.problem) for issue in info.value.issues}
    assert got == {
        ("demo/competition.yml", "deadline", None),
        ("demo/competition.yml", "prizes", None),
        ("demo/softmax_py/task.yml", "lang", "softmax_py"),
        ("demo/competition.yml", "problems[1].gpus", "b"),
        ("demo/competition.yml", "problems[2].name", "b"),
        ("demo/competition.yml", "problems[2].directory", "b"),
        ("demo/competition.yml", "problems[3].harness", "c"),
        ("demo/competition.yml", "problems[4].name", None),
        ("demo/competition.yml", "problems[4].directory", None),
    }
    assert "demo/competition.yml: deadline: '2026-03-01 24:00' is not a date and time" in str(info.value)
    assert "problems[2].directory: ../outside resolves outside the competition directory (problem b)" in str(
        info.value)
    assert "problems[2].name: duplicate name (also problems[1])" in str(info.value)


@pytest.mark.parametrize(("text", "key", "fragment"), [
    ("name: [x\n", None, "invalid YAML at line 1, column 7"),
    ("[]\n", None, "expected a mapping at the top level, got list"),
    ("name: x\ndescription: y\ndeadline: soon\nproblems: []\n", "deadline",
     "'soon' is not a date and time; use \"2025-06-30\" (00:00 UTC), \"2025-06-30 23:59\" or ISO 8601"),
    ("name: x\ndeadline: [2026]\nproblems: []\n", "deadline", "got list"),
    (f"name: {'x' * 121}\nproblems: []\n", "name", "at most 120 characters, got 121"),
    ("name: x\ndescription: y\ndeadline: 2026-03-01T00:00:00Z\nproblems: []\n", "problems",
     "expected a non-empty list of problems"),
    ("name: x\ndescription: y\ndeadline: 2026-03-01T00:00:00Z\n", "problems", "required key is missing"),
    ("name: x\ndescription: y\ndeadline: 2026-03-01T00:00:00Z\nproblems: [softmax_py]\n", "problems[0]",
     "expected a mapping, got str"),
])
def test_malformed_competition(tmp_path, text, key, fragment):
    write_tree(tmp_path)
    with pytest.raises(CompetitionError) as info:
        load_competition(write_competition(tmp_path, text))
    issues = info.value.issues
    assert any(issue.key == key and fragment in issue.message for issue in issues), info.value.errors


# KernelBot's problem sync reads a deadline with "%Y-%m-%d %H:%M", then "%Y-%m-%d" (strptime: one-digit hours
# too), takes it as UTC, and treats an empty one as not given. ISO 8601 is ours and stays accepted.
@pytest.mark.parametrize(("value", "expected"), [
    ("2025-06-30", datetime(2025, 6, 30, tzinfo=UTC)),
    ("2025-11-29 6:59", datetime(2025, 11, 29, 6, 59, tzinfo=UTC)),
    ("2026-04-07 07:59", datetime(2026, 4, 7, 7, 59, tzinfo=UTC)),
    ("2027-01-31T23:59Z", datetime(2027, 1, 31, 23, 59, tzinfo=UTC)),
    ("2026-04-01T12:00:00+02:00", datetime(2026, 4, 1, 10, tzinfo=UTC)),
    (date(2025, 6, 30), datetime(2025, 6, 30, tzinfo=UTC)),  # unquoted in YAML
    (datetime(2025, 6, 30, 8), datetime(2025, 6, 30, 8, tzinfo=UTC)),
    ("", None), ("  ", None), (None, None),
])
def test_deadline_forms(value, expected):
    assert parse_deadline(value) == expected


@pytest.mark.parametrize("value", ["soon", "2025-13-01", "30/06/2025", "2025-06-30 6", 20250630, ["2025-06-30"]])
def test_bad_deadlines_say_which_forms_work(value):
    with pytest.raises(ValueError, match=r"not a date and time; use \"2025-06-30\"|expected a date and time"):
        parse_deadline(value)


def test_competition_deadlines_as_published_upstream(tmp_path):
    """reference-kernels files: `deadline: ""` for the competition, bare dates and one-digit hours per problem."""
    write_tree(tmp_path, changed(gpus=["H100"]))
    write_tree(tmp_path, changed(gpus=["H100"]), name="softmax_v2")
    path = write_competition(tmp_path, 'name: Practice\ndeadline: ""\ndescription: ""\nproblems:\n'
                             '  - {directory: softmax_py, name: softmax, deadline: "2025-06-30"}\n'
                             '  - {directory: softmax_v2, name: softmax-v2, deadline: "2025-11-29 6:59"}\n'
                             '  - {directory: softmax_v2, name: softmax-v3}\n')
    competition = load_competition(path)
    assert competition.deadline is None
    assert [p.deadline for p in competition.problems] == [
        datetime(2025, 6, 30, tzinfo=UTC), datetime(2025, 11, 29, 6, 59, tzinfo=UTC), None]


def test_boolean_and_list_case_values_pass_through(tmp_path):
    cases = [{"m": [128, 256], "nomask": True, "has_bias": False, "g": 2, "seed": 1}]
    task = load_task(write_tree(tmp_path, changed(tests=cases, benchmarks=[{"m": [], "seed": 2}])))
    assert task.tests == cases and task.benchmarks == [{"m": [], "seed": 2}]
    # as KernelBot writes a case for eval.py: f"{k}: {v}" joined by "; "
    assert case_line(task.tests[0]) == "m: [128, 256]; nomask: True; has_bias: False; g: 2; seed: 1"


def collection(base: Path, helper: str = "../../pmpp_v2/utils.py", competition: bool = True) -> Path:
    """A problem collection like reference-kernels: linalg/qr_py takes its utils.py from pmpp_v2/."""
    task = changed(files=[TASK["files"][0], {"name": "utils.py", "source": helper},
                          {"name": "reference.py", "source": "reference.py"}], config=..., templates=...)
    task_dir = write_tree(base, task, {"softmax_py/reference.py": "REF = 1\n", "pmpp_v2/utils.py": "U = 2\n"},
                          name="qr_py")
    linalg = base / "demo" / "linalg"
    linalg.mkdir()
    task_dir = task_dir.rename(linalg / "qr_py")
    if competition:
        (base / "demo" / "linalg.yaml").write_text("name: Linear algebra\nproblems:\n"
                                                    "  - {name: qr, directory: linalg/qr_py, gpus: [H100]}\n")
    return task_dir


def test_helper_two_levels_up_comes_from_the_collection(tmp_path):
    task_dir = collection(tmp_path)
    assert collection_root(task_dir) == tmp_path / "demo"
    assert load_task(task_dir).files["utils.py"] == "U = 2\n"
    assert load_competition(tmp_path / "demo" / "linalg.yaml").problems[0].task.files["utils.py"] == "U = 2\n"


def test_without_competition_files_the_root_is_explicit(tmp_path):
    task_dir = collection(tmp_path, competition=False)
    with pytest.raises(TaskFileError) as info:
        load_task(task_dir)
    assert info.value.key == "files[1].source"
    assert ("../../pmpp_v2/utils.py resolves outside the problem collection; files may come from anywhere inside "
            "the problem collection linalg/ (pass --root with a directory that holds both") in str(info.value)
    assert load_task(task_dir, root=tmp_path / "demo").files["utils.py"] == "U = 2\n"


def test_a_helper_outside_the_collection_is_refused(tmp_path):
    (tmp_path / "secret.py").write_text("SECRET = 1\n")
    task_dir = collection(tmp_path, helper="../../../secret.py")
    with pytest.raises(TaskFileError, match=r"resolves outside the problem collection; .* \(pass --root"):
        load_task(task_dir)


def test_collection_root_never_climbs_above_within(tmp_path):
    task_dir = collection(tmp_path)
    assert collection_root(task_dir, within=tmp_path / "demo" / "linalg") == tmp_path / "demo" / "linalg"


def test_names_must_fit_their_columns_and_urls(tmp_path):
    long_dir = "p" * (MAX_PROBLEM_NAME + 1)
    with pytest.raises(TaskFileError, match=f"is {MAX_PROBLEM_NAME + 1} characters; at most 100"):
        load_task(write_tree(tmp_path / "a", name=long_dir))
    write_tree(tmp_path / "b", changed(gpus=["H100"]))
    path = write_competition(tmp_path / "b", {"name": "x", "problems": [
        {"name": "bad name!", "directory": "softmax_py"}, {"name": "l" * 101, "directory": "softmax_py"}]})
    with pytest.raises(CompetitionError) as info:
        load_competition(path)
    assert [(issue.key, issue.message) for issue in info.value.issues] == [
        ("problems[0].name", "'bad name!' is not a valid leaderboard name: use only letters, digits, - and _"),
        ("problems[1].name", "leaderboard names are at most 100 characters, got 101")]


def test_name_limits_match_the_columns():
    assert Problem._meta.get_field("name").max_length == MAX_PROBLEM_NAME
    assert Leaderboard._meta.get_field("name").max_length == MAX_LEADERBOARD_NAME
    assert Competition._meta.get_field("name").max_length == MAX_COMPETITION_NAME
