import pytest

from runners.harness.job import JobError, parse_job
from runners.harness.problem import derive_seed, format_spec


def test_defaults(tmp_path):
    job = parse_job({"mode": "test", "workdir": str(tmp_path)})
    assert (job.protocol, job.lang, job.ranking_by, job.main) == ("kernelbot", "py", "last", "eval.py")
    assert job.timing.rel_ci == 0.0 and job.timing.run_spread == 0.12 and job.timeout("test") == 180  # no fixed floor
    assert isinstance(job.seed, int)
    assert "seed" not in repr(job)


@pytest.mark.parametrize(
    "raw",
    [[], {"mode": "test"}, {"workdir": "/"}, {"mode": "race", "workdir": "/"}, {"mode": "test", "workdir": "rel"},
     {"mode": "test", "workdir": "/", "tests": [{"m": [[1]]}]},
     {"mode": "test", "workdir": "/", "tests": [{"m": 1.5}]}, {"mode": "test", "workdir": "/", "seed": "x"},
     {"mode": "test", "workdir": "/", "ranking_by": "median"}],
)
def test_invalid_jobs(raw):
    with pytest.raises(JobError):
        parse_job(raw)


@pytest.mark.parametrize(("ranking_by", "ranked"), [("last", 1), ("mean", 3), ("geom", 3)])
def test_ranked_cases(tmp_path, ranking_by, ranked):
    job = parse_job({"mode": "leaderboard", "workdir": str(tmp_path), "ranking_by": ranking_by,
                     "benchmarks": [{"n": 1}, {"n": 2}, {"n": 3}]})
    assert len(job.ranked_cases) == ranked
    assert job.ranked_cases[-1] == {"n": 3}


def test_limits_and_timeouts_reach_the_sandbox(tmp_path):
    job = parse_job({"mode": "test", "workdir": str(tmp_path), "limits": {"memory_bytes": 1 << 30, "bogus": 1},
                     "timeouts": {"test": 10, "benchmark": 20, "ranked": 30}})
    limits = job.sandbox_limits()
    assert limits.memory_bytes == 1 << 30 and limits.wall_seconds == 10 + 20 + 30 + 60


def test_spec_format_and_seeds():
    assert format_spec({"m": 1, "dtype": "fp16", "seed": 3}) == "m: 1; dtype: fp16; seed: 3"
    seeds = {derive_seed(42, phase, i, k, 7) for phase in ("test", "ranked") for i in range(3) for k in range(3)}
    assert len(seeds) == 18 and all(0 <= s < 2**32 for s in seeds)
    assert derive_seed(42, "test", 0, 0) == derive_seed(42, "test", 0, 0) != derive_seed(43, "test", 0, 0)
