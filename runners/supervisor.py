"""Keeps this machine's django-q2 cluster making progress (`manage.py workers`; `manage.py serve` runs it too).

django-q2 restarts a worker that dies, but not a cluster that stops making progress: an idle worker killed inside
`multiprocessing.Queue.get()` leaves the queue's reader lock held and every other worker blocks on it, and
SIGTERM then no longer stops the cluster. So the cluster runs as a child process group of this supervisor, which

- when runs have waited `STALL` seconds while no worker is busy and none started a task, dispatches them itself
  (their message may have died with a killed cluster; dispatch is short and idempotent, and sending copies
  instead filled the broker), and restarts the cluster (killing the whole group) when messages still wait in the
  broker then: the cluster is wedged. It also restarts it when its main process exits;
- runs the periodic run checks of `settings.CLUSTER_TICKS` (dotted path → interval): reaping overdue runs every
  `REAP_INTERVAL` seconds, from outside the cluster it rescues (runners heartbeat, so a run whose worker died is
  retried within seconds; a queued run no worker took within seconds, its message lost while the broker was away,
  is dispatched here even while busy workers go on with later runs), and polling remote runs every `POLL_INTERVAL`
  seconds (django-q schedules have minute granularity, too coarse for a poll that catches a missed callback);
- on SIGTERM or SIGINT stops the cluster, killing it after `STOP_GRACE` seconds.

Each worker writes its state to a heartbeat file named by its pid in the directory the supervisor gives it
(`KERNELBOT_CLUSTER_HEARTBEATS`): "busy <time>" when it starts a task, "idle <time>" when it ends one, "idle 0"
when it is spawned. Every process forked under supervision dies with its parent, so nothing outlives the group.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.utils import timezone
from django.utils.module_loading import import_string
from django_q.signals import post_execute_in_worker, post_spawn, pre_execute
from redis.exceptions import RedisError

from runners.queue import broker

log = logging.getLogger(__name__)
HEARTBEATS_ENV = "KERNELBOT_CLUSTER_HEARTBEATS"
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
TICK = 0.5


def _prctl(option: int, value: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value)


def die_with_parent() -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


# --- in the cluster's processes ---------------------------------------------------------------------------------

def _beat(state: str, at: float) -> None:
    directory = os.environ.get(HEARTBEATS_ENV)
    if not directory:
        return
    path = Path(directory) / str(os.getpid())
    temporary = path.with_suffix(".tmp")
    with contextlib.suppress(OSError):  # the supervisor cleared the directory: it is restarting the cluster
        temporary.write_text(f"{state} {at}")
        os.replace(temporary, path)


def _spawned(**_) -> None:
    _beat("idle", 0)


def _task_started(**_) -> None:
    _beat("busy", time.time())


def _task_ended(**_) -> None:
    _beat("idle", time.time())


def connect_worker_heartbeats() -> None:
    """Called at start-up by every process; only processes of a supervised cluster write heartbeats."""
    if not os.environ.get(HEARTBEATS_ENV):
        return
    post_spawn.connect(_spawned, dispatch_uid="kernelbot-heartbeat-spawned")
    pre_execute.connect(_task_started, dispatch_uid="kernelbot-heartbeat-started")
    post_execute_in_worker.connect(_task_ended, dispatch_uid="kernelbot-heartbeat-ended")
    os.register_at_fork(after_in_child=die_with_parent)


# --- the supervisor ----------------------------------------------------------------------------------------------

class Supervisor:
    def __init__(self, command: list[str] | None = None):
        self.command = command or [sys.executable, str(settings.BASE_DIR / "manage.py"), "qcluster"]
        self.stall = settings.CLUSTER_STALL_SECONDS
        self.start_grace = settings.CLUSTER_START_SECONDS
        self.cluster: subprocess.Popen | None = None
        self.started_at = self.last_task = 0.0
        self.ready_at: float | None = None  # when its first worker was spawned
        self.resent_at: float | None = None
        self.restart_at = 0.0
        self.failed_starts = 0
        self.stopping = False
        self.heartbeats = Path(tempfile.mkdtemp(prefix="kernelbot-heartbeats-"))
        # the run lifecycle is the leaderboards app's (runners never import it): named in settings
        self.resend = import_string(settings.CLUSTER_RESEND)
        self.queued = import_string(settings.CLUSTER_QUEUED)
        self.ticks = [(import_string(path), interval) for path, interval in settings.CLUSTER_TICKS.items()]
        self.next_tick = [0.0] * len(self.ticks)

    def run(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._stop)
        with contextlib.suppress(OSError, AttributeError):
            _prctl(PR_SET_CHILD_SUBREAPER, 1)  # the cluster's orphans come back here to be reaped
        try:
            while not self.stopping:
                self._reap_children()
                if self.cluster is None and time.monotonic() >= self.restart_at:
                    self._start()
                self._check()
                time.sleep(TICK)
        finally:
            self._stop_cluster()
            shutil.rmtree(self.heartbeats, ignore_errors=True)

    def _check(self) -> None:
        """The due periodic checks (the first one, the reaper, also watches the cluster's progress)."""
        try:
            for i, (tick, interval) in enumerate(self.ticks):
                if time.monotonic() < self.next_tick[i]:
                    continue
                self.next_tick[i] = time.monotonic() + interval
                if count := tick():
                    log.info("%s: %s runs", tick.__name__, count)
                if i == 0 and self.cluster is not None:
                    self._check_progress()
        except Exception:  # the database may be restarting: log, reconnect next time
            log.exception("supervisor check failed")
            with contextlib.suppress(Exception):
                connection.close()

    def _stop(self, *_) -> None:
        self.stopping = True

    def _start(self) -> None:
        shutil.rmtree(self.heartbeats, ignore_errors=True)
        self.heartbeats.mkdir(parents=True)
        self.cluster = subprocess.Popen(self.command, cwd=settings.BASE_DIR, start_new_session=True,
                                        env={**os.environ, HEARTBEATS_ENV: str(self.heartbeats)},
                                        preexec_fn=die_with_parent)
        self.started_at = time.time()
        self.last_task, self.ready_at, self.resent_at = 0.0, None, None
        log.info("started the worker cluster (process group %s)", self.cluster.pid)

    def _check_progress(self) -> None:
        """No worker busy and none started a task for a stall period: dispatch the waiting runs here (no broker
        message). If runs were queued since a worker last started a task (their messages went to this cluster, even
        if the reaper has dispatched them since), or messages wait in the broker, the cluster is wedged: restart it.
        A new cluster's quiet time starts when its first worker is spawned (importing Django and forking take many
        seconds on a busy machine), or `start_grace` seconds after its start if no worker ever is."""
        busy = self._read_heartbeats()
        up = self.ready_at if self.ready_at is not None else self.started_at + self.start_grace
        quiet_since = max(up, self.last_task, self.resent_at or 0.0)
        if busy or time.time() - quiet_since < self.stall:
            return
        cutoff = timezone.now() - timedelta(seconds=self.stall)
        unseen = self.queued(queued_after=datetime.fromtimestamp(max(self.started_at, self.last_task), tz=UTC),
                             queued_before=cutoff)
        lost = self.resend(queued_before=cutoff)  # still queued: messages lost or ignored
        self.resent_at = time.time()
        if lost:
            log.warning("runs waited %.0f s while no worker started a task; dispatched %s of them here", self.stall,
                        lost)
        try:
            waiting = broker().queue_size()
        except (RedisError, OSError) as exc:  # the broker is away: a new cluster would not bring it back
            log.warning("cannot see the task queue (%r); the reaper dispatches queued runs meanwhile", exc)
            return
        if not unseen and waiting == 0:
            return
        log.error("the worker cluster started no task for %.0f s while %s runs sent to it waited; restarting it",
                  self.stall, unseen or waiting)
        self._kill_cluster()
        self.restart_at = 0.0

    def _read_heartbeats(self) -> int:
        """Busy workers that are still alive in the cluster; updates the time of the last task start or end."""
        busy = 0
        for path in self.heartbeats.iterdir():
            if not path.name.isdigit():
                continue
            try:
                state, at = path.read_text().split()
            except (OSError, ValueError):
                continue
            self.last_task = max(self.last_task, float(at))
            try:
                alive = os.getpgid(int(path.name)) == self.cluster.pid
            except ProcessLookupError:
                alive = False
            if not alive:
                path.unlink(missing_ok=True)
                continue
            if self.ready_at is None:
                self.ready_at = time.time()
            if state == "busy":
                busy += 1
        return busy

    def _reap_children(self) -> None:
        """Collect every exited child (the cluster's orphans too); notice when the cluster's main process exits."""
        for pid, status in _reap_exited():
            if self.cluster is not None and pid == self.cluster.pid:
                self.cluster.returncode = os.waitstatus_to_exitcode(status)
                uptime = time.time() - self.started_at
                log.error("the worker cluster exited (%s) after %.0f s; restarting it", self.cluster.returncode,
                          uptime)
                self._kill_cluster()
                self.failed_starts = 0 if uptime > 60 else self.failed_starts + 1
                self.restart_at = time.monotonic() + min(30, 2 ** self.failed_starts - 1)

    def _kill_cluster(self, grace: float = 0) -> None:
        """Stop the whole process group (SIGTERM first when there is a grace period) and wait until it is gone."""
        cluster, self.cluster = self.cluster, None
        if cluster is None:
            return
        if grace and cluster.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(cluster.pid, signal.SIGTERM)
            self._wait_group(cluster.pid, grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cluster.pid, signal.SIGKILL)
        self._wait_group(cluster.pid, 10)

    @staticmethod
    def _wait_group(pgid: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _reap_exited()  # zombies would still count as members of the group
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)

    def _stop_cluster(self) -> None:
        if self.cluster is not None:
            log.info("stopping the worker cluster")
            self._kill_cluster(grace=settings.CLUSTER_STOP_GRACE)


def _reap_exited() -> list[tuple[int, int]]:
    exited = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return exited
        if pid == 0:
            return exited
        exited.append((pid, status))
