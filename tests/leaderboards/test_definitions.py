"""Every problem imports to the definition it imported to before the typed model (issue 37): definitions.json holds,
per task directory and competition file, a digest of what the hand-written validator produced (or its messages).

Always compared: this repository's problems/. When KERNELBOT_UPSTREAM_RK / KERNELBOT_UPSTREAM_KB name git clones (or
bare mirrors) of gpu-mode/reference-kernels and gpu-mode/kernelbot, their problems/ and examples/ at the commits
recorded are compared too; unset, only problems/ is. `python -m tests.leaderboards.test_definitions` prints the
current entries (to record a deliberate change)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from taskspec import jobspec
from taskspec.loader import TaskFileError, load_competition, load_task

REPO = Path(__file__).resolve().parents[2]
EXPECTED = Path(__file__).with_name("definitions.json")
UPSTREAM = {"KERNELBOT_UPSTREAM_RK": "gpu-mode/reference-kernels", "KERNELBOT_UPSTREAM_KB": "gpu-mode/kernelbot"}


def dump(definition: Any) -> Any:
    if hasattr(definition, "to_json"):
        return definition.to_json()
    if hasattr(definition, "__dataclass_fields__"):
        return {name: dump(getattr(definition, name)) for name in definition.__dataclass_fields__}
    return [dump(item) for item in definition] if isinstance(definition, list) else definition


def outcome(load, path: Path) -> str | list[str]:
    try:
        text = json.dumps(dump(load(path)), sort_keys=True, default=str, ensure_ascii=False)
    except TaskFileError as exc:
        return exc.errors
    return hashlib.sha256(text.encode()).hexdigest()


def collection(root: Path) -> dict[str, str | list[str]]:
    """Each task directory and each competition file beside the collection's top, as the importer reads them."""
    entries = {str(p.parent.relative_to(root)): outcome(load_task, p.parent) for p in sorted(root.rglob("task.yml"))}
    entries |= {p.name: outcome(load_competition, p) for p in sorted(root.glob("*.y*ml"))}
    return entries


def test_problems_import_as_before(tmp_path):
    recorded = json.loads(EXPECTED.read_text())
    assert collection(REPO / "problems") == recorded["problems"]
    for variable, name in UPSTREAM.items():
        if not (clone := os.environ.get(variable)):
            continue
        expected = recorded[name]
        archive = subprocess.run(["git", "-C", clone, "archive", expected["commit"], expected["path"]],
                                 capture_output=True, check=False)
        assert archive.returncode == 0, f"{clone} lacks commit {expected['commit']}: {archive.stderr.decode()}"
        jobspec.extract_tarball(archive.stdout, tmp_path / name)
        assert collection(tmp_path / name / expected["path"]) == expected["entries"], name


if __name__ == "__main__":
    found = {"problems": collection(REPO / "problems")}
    for name, path in zip(UPSTREAM.values(), sys.argv[1:], strict=False):
        found[name] = {"path": Path(path).name, "entries": collection(Path(path))}
    print(json.dumps(found, indent=1, ensure_ascii=False))
