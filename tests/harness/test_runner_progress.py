"""The harness runner passes progress on at most every PROGRESS_INTERVAL s, and never drops the latest: a burst
followed by a quiet phase still shows where the harness is."""

from __future__ import annotations

import sys
import textwrap
import time

from runners.harness import runner
from runners.harness.runner import PROGRESS_INTERVAL, run_harness

# a stand-in `python -m runners.harness`: a burst of progress lines, a quiet phase, then the result
FAKE_HARNESS = """
import json, sys, time
job = json.load(sys.stdin)
for done in range(1, 51):
    print(json.dumps({"event": "progress", "phase": "test", "done": done, "total": 50}), flush=True)
time.sleep(4 * PROGRESS_INTERVAL)
print(json.dumps({"event": "result", "nonce": job["nonce"], "status": "ok"}), flush=True)
"""


def test_a_burst_of_progress_ends_with_its_latest_line_passed_on(tmp_path):
    package = tmp_path / "runners" / "harness"
    package.mkdir(parents=True)
    for init in (tmp_path / "runners" / "__init__.py", package / "__init__.py"):
        init.touch()
    (package / "__main__.py").write_text(textwrap.dedent(FAKE_HARNESS).replace("PROGRESS_INTERVAL",
                                                                                 str(PROGRESS_INTERVAL)))
    seen: list[int] = []
    result, failure = run_harness({"workdir": str(tmp_path)}, python=sys.executable, pythonpath=str(tmp_path),
                                  timeout=30, on_progress=lambda event: seen.append(event["done"]),
                                  still_wanted=lambda: True, check_interval=5)
    assert failure == "" and result["status"] == "ok"
    assert seen[-1] == 50  # the last line of the burst was shown before the quiet phase ended
    assert len(seen) < 50  # and the burst was coalesced, not passed on line by line


def test_a_harness_that_dies_without_a_result_is_reported_with_its_stderr_read_to_the_end(tmp_path, monkeypatch):
    """The parent's exit can be seen before the stderr reader has drained the pipe (a busy machine): the failure
    still carries what the harness said, e.g. that this Python has no torch."""
    package = tmp_path / "runners" / "harness"
    package.mkdir(parents=True)
    for init in (tmp_path / "runners" / "__init__.py", package / "__init__.py"):
        init.touch()
    (package / "__main__.py").write_text("import sys\nsys.exit(\"ModuleNotFoundError: No module named 'torch'\")\n")
    read_tail = runner._tail

    def late_reader(stream, keep, **kwargs):
        time.sleep(1)  # the reader thread scheduled late, as under load
        read_tail(stream, keep, **kwargs)

    monkeypatch.setattr(runner, "_tail", late_reader)
    result, failure = run_harness({"workdir": str(tmp_path)}, python=sys.executable, pythonpath=str(tmp_path),
                                  timeout=30, on_progress=lambda event: None, still_wanted=lambda: True,
                                  check_interval=5)
    assert result is None
    assert failure.startswith("harness exited with code 1 without a result: ")
    assert "No module named 'torch'" in failure
