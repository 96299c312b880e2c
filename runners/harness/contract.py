"""The job contract between the platform and the harness: field names, allowed values and the ONE set of defaults.

Django-free and stdlib-only (it ships to remote runners with the harness). `runners/jobs.py` builds a job from
these names and `harness/job.py` parses it with these defaults, so the two sides cannot disagree.

Job (JSON object, all but mode/workdir optional):
    mode, workdir, protocol, lang, main, tests, benchmarks, ranking_by, seed, multi_gpu, gpus, timeouts
    ({phase: seconds} for PHASES), limits (sandbox.Limits fields), timing (Timing fields), cuda, nonce, sandbox_uid
The remote runner API wraps it: {"job": <job without workdir/gpus/sandbox_uid/nonce>, "files": {name: text},
"gpu_count": n, "timeout_s": s}; the agent fills in what only the runner machine knows.
"""

from __future__ import annotations

MODES = ("test", "benchmark", "leaderboard", "profile")
PROTOCOLS = ("kernelbot", "popcorn")
LANGS = ("py", "cu")
RANKING_RULES = ("last", "mean", "geom")
PHASES = ("test", "benchmark", "ranked", "compile")
FIELDS = ("mode", "workdir", "protocol", "lang", "main", "tests", "benchmarks", "ranking_by", "seed", "multi_gpu",
          "gpus", "timeouts", "limits", "timing", "cuda", "nonce", "sandbox_uid")
# What only the machine that runs the harness knows; the platform leaves them out of a remote job.
RUNNER_FIELDS = ("workdir", "gpus", "sandbox_uid", "nonce")

# Per phase, when the task does not say; KernelBot's Timeout.COMPILE for nvcc.
DEFAULT_PHASE_TIMEOUT_S = 180
COMPILE_TIMEOUT_S = 120
# Slack on top of the phases for interpreter start, imports and teardown (the run's total budget).
TOTAL_MARGIN_S = 60
MODE_PHASES = {"test": ("test",), "benchmark": ("benchmark",), "profile": ("benchmark",),
               "leaderboard": ("test", "benchmark", "ranked")}

# Sandbox limits of one run. memory_bytes is per process (RLIMIT_AS, or RLIMIT_DATA with GPUs bound); what bounds
# the whole tree is the memory cgroup (tree_memory_bytes, default: the node's share). 16 GiB, the value every run
# has been evaluated with so far (the platform always sent it; the harness's own 8 GiB only applied to hand-run
# jobs): changing it would change verdicts of already-ranked code, and on GPU nodes host-side staging of large
# inputs needs more than 8 GiB per process while the cgroup still protects the node.
# disk_bytes: what the run's files in its workdir may take together (FSIZE bounds each file); a pool may set it.
# processes: tasks (threads count) of a run's tree; honest torch/triton/OpenMP code on a 200-core node stays far below
# 4096, and an unbounded fork bomb still reaches it within seconds (its first refused fork ends the tree).
# process_count: processes (not threads) the tree may hold at once; 0: max(64, 32 per core of its CPU limit). A bomb
# of expensive forks (a torch-loaded process) makes ~100 a second on a core: it meets this long before 4096 tasks.
# cpus_per_device: the cores a run may use per device it holds (its cpu cgroup); 0: its devices' share of the node's
# cores less a reserve for the host (sandbox.cpu_limit); a pool may set it.
DEFAULT_LIMITS = {"memory_bytes": 16 << 30, "cpu_seconds": 3600, "processes": 4096, "file_size_bytes": 256 << 20,
                  "open_files": 256, "output_bytes": 64 << 10, "shm_bytes": 256 << 20, "tree_memory_bytes": 0,
                  "runs_per_node": 1, "disk_bytes": 1 << 30, "process_count": 0, "cpus_per_device": 0}

# Timing: stop once the ratio's 95 % interval is as narrow as the between-run spread makes useful (stats.needed_rel_ci;
# rel_ci: a floor, none by default), within sample and time budgets per case. The platform's settings override these
# from the environment (KERNELBOT_REL_CI, ...).
TIMING_DEFAULTS = {"rel_ci": 0.0, "min_samples": 10, "max_samples": 1000, "case_budget_s": 3.0, "warmup_s": 0.2,
                   "run_spread": 0.12}


def total_timeout(mode: str, lang: str, timeouts: dict[str, float]) -> int:
    """A run's whole wall-clock budget: its mode's phases, nvcc for CUDA tasks, and the margin."""
    phases = sum(float(timeouts.get(p, DEFAULT_PHASE_TIMEOUT_S)) for p in MODE_PHASES.get(mode, ("test",)))
    compile_s = float(timeouts.get("compile", COMPILE_TIMEOUT_S)) if lang == "cu" else 0
    return int(phases + compile_s + TOTAL_MARGIN_S)
