"""Every hostile submission in tests/cheats/ must get its expected verdict from the real harness."""

import re
from pathlib import Path

import pytest

from runners.harness import sandbox

from .helpers import CHEATS, run_submission

pytestmark = pytest.mark.slow
CHEAT_FILES = sorted(CHEATS.glob("*.py"))
_box = sandbox.describe()
ISOLATED = bool(_box.get("pid_namespace")) and _box.get("uid") != 0


def header(path: Path, key: str) -> str:
    match = re.search(rf"^# {key}: (.+)$", path.read_text(), re.MULTILINE)
    assert match, f"{path.name} has no '# {key}:' header"
    return match.group(1).strip()


@pytest.mark.parametrize("cheat", CHEAT_FILES, ids=lambda p: p.stem)
def test_cheat_gets_expected_verdict(tmp_path, cheat):
    expected = header(cheat, "expected").split("|")
    if "# needs: isolation" in cheat.read_text() and not ISOLATED:
        pytest.skip("this defence needs the bubblewrap sandbox (pid namespace, uid drop)")
    result = run_submission(tmp_path, cheat, header(cheat, "mode"),
                            timeouts={"test": 10, "benchmark": 30, "ranked": 30})
    assert result["status"] == "ok"
    assert result["verdict"] != "pass" and result["passed"] is False
    assert result["verdict"] in expected, (result["verdict"], result["error"])
    assert result["error"]
    assert "LEAKED" not in result["stderr"]
    assert result["ranked"] == []


def test_corpus_is_complete():
    assert len(CHEAT_FILES) >= 20
