"""Reserve under a burst: issue 25's 50 concurrent `POST /api/v1/gpus/reservations` from 10 users on a pool of
2 nodes × 4 H100, against the production layout (granian, `--workers 2`, PostgreSQL, Redis, `manage.py workers`).

    python bench/reserve.py [--bursts 5] [--against REF] [--floor]

Each burst starts from an empty queue. The load generator is a raw-socket client: 50 keep-alive connections opened
and used once before the burst, then every request written at once, so the client takes almost none of the shared
cores. Per burst: the answers' p50/p95/max, their codes (201, or 409 for a user's limit; anything else is an error),
and how long until every request recorded is active or holds a promised start (planning may follow the answer).
`--against REF`: the same bursts on git REF's tree, by turns with this one (speed drifts here: compare in one run).
`--floor`: bursts of `GET /api/v1/health` instead, the least a request costs this stack."""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from api import DB_URL, PG, host_speed_ns, server_env  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
USERS = 10
POOL = """
from runners.models import Gpu, GpuPool, GpuType, GpuVendor, Node
from runners.reservations.models import PoolPolicy
h100, _ = GpuType.objects.get_or_create(name="H100", defaults={"vendor": GpuVendor.NVIDIA})
pool = GpuPool.objects.create(name="burst")
for n in range(2):
    node = Node.objects.create(pool=pool, hostname=f"burst-node{n}")
    Gpu.objects.bulk_create(Gpu(node=node, gpu_type=h100, index=i) for i in range(4))
PoolPolicy.objects.create(pool=pool, competition_share=0)
"""


def tree_cpu_seconds(root: int | None = None, name: str = "") -> float:
    """User + system CPU so far of a process and all its descendants (or of every process named `name`)."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm, _, rest = (entry / "stat").read_text().partition(") ")
                stats[int(entry.name)] = (comm.partition("(")[2], rest.split())
            except OSError:
                continue
    if name:
        chosen = {pid for pid, (comm, _) in stats.items() if comm == name}
    else:
        chosen, grew = {root}, True
        while grew:
            more = {pid for pid, (_, f) in stats.items() if int(f[1]) in chosen} - chosen
            chosen |= more
            grew = bool(more)
    return sum(int(stats[p][1][11]) + int(stats[p][1][12]) for p in chosen if p in stats) / os.sysconf("SC_CLK_TCK")


def psql(sql: str, db: str = DB_URL) -> str:
    return subprocess.run(["psql", db, "-Atqc", sql], check=True, capture_output=True, text=True).stdout.strip()


def prepare(tree: Path) -> list[str]:
    psql("DROP DATABASE IF EXISTS kernelbot_bench WITH (FORCE)", PG + "/postgres")
    psql("CREATE DATABASE kernelbot_bench", PG + "/postgres")
    script = f"""
import django; django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
{POOL}
from django.contrib.auth import get_user_model
from leaderboards.access.actions import do_create_token
for i in range({USERS}):
    print(do_create_token(get_user_model().objects.create(username=f"burst{{i}}"))[1])
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=tree, env={**server_env(), "PYTHONPATH": str(tree)},
                         check=True, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.startswith("kb_")]


def start(tree: Path, workers: int) -> tuple[list[subprocess.Popen], int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**server_env(), "PYTHONPATH": str(tree), "LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING")}
    web = subprocess.Popen([sys.executable, "-m", "granian", "--interface", "asginl", "--port", str(port),
                            "--workers", str(workers), "--log-level", "warning", "kernelbot.asgi:application"],
                           cwd=tree, env=env)
    with open(os.environ.get("BENCH_WORKERS_LOG", os.devnull), "ab") as log:
        cluster = subprocess.Popen([sys.executable, "manage.py", "workers"], cwd=tree, env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
    for _ in range(150):
        try:
            if b" 200 " in request(port, b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")[:20]:
                break
        except OSError:
            pass
        time.sleep(0.2)
    time.sleep(2)  # the cluster's first tick
    return [web, cluster], port


def request(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        return read_response(s)


def read_response(s: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
        b"content-length"))
    while len(body) < length:
        body += s.recv(65536)
    return head + b"\r\n\r\n" + body


def reserve_request(token: str, i: int) -> bytes:
    body = json.dumps({"gpu_type": "H100", "gpu_count": 1 + i % 2, "minutes": 30 + i}).encode()
    return (f"POST /api/v1/gpus/reservations HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def burst(port: int, tokens: list[str], n: int, procs: list[subprocess.Popen], floor: bool = False) -> dict:
    socks = []
    for i in range(n):  # open and warm every connection (each worker imports and connects on its first request)
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(f"GET /api/v1/gpus/reservations HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                  f"{tokens[i % len(tokens)]}\r\n\r\n".encode())
        read_response(s)
        socks.append(s)
    psql("DELETE FROM reservations_reservationevent; DELETE FROM reservations_devicehold; "
         "DELETE FROM reservations_reservation")
    payloads = [b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" if floor else
                reserve_request(tokens[i % len(tokens)], i) for i in range(n)]
    selector = selectors.DefaultSelector()
    sent: dict[int, float] = {}
    cpu = [tree_cpu_seconds(p.pid) for p in procs] + [tree_cpu_seconds(name="postgres")]
    t0 = time.perf_counter()
    for i, (s, raw) in enumerate(zip(socks, payloads, strict=True)):
        s.sendall(raw)
        sent[i] = time.perf_counter()
        s.setblocking(False)
        selector.register(s, selectors.EVENT_READ, [i, b""])
    latencies, codes = [], []
    while len(latencies) < n:
        for key, _ in selector.select(timeout=60):
            i, buf = key.data
            buf += key.fileobj.recv(65536)
            key.data[1] = buf
            head, sep, body = buf.partition(b"\r\n\r\n")
            if not sep:
                continue
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            if len(body) >= length:
                latencies.append(time.perf_counter() - sent[i])
                codes.append(int(head.split()[1]))
                selector.unregister(key.fileobj)
    answered = time.perf_counter()
    web_cpu = tree_cpu_seconds(procs[0].pid) - cpu[0]
    pg_cpu = tree_cpu_seconds(name="postgres") - cpu[2]
    while int(psql("SELECT count(*) FROM reservations_reservation WHERE status = 'pending' AND planned_start IS "
                   "NULL")) and time.perf_counter() - answered < 30:
        time.sleep(0.01)
    planned = time.perf_counter() - t0
    workers_cpu = tree_cpu_seconds(procs[1].pid) - cpu[1]
    for s in socks:
        s.close()
    latencies.sort()
    double = int(psql("SELECT count(*) FROM (SELECT gpu_id FROM reservations_devicehold WHERE ended IS NULL "
                      "GROUP BY gpu_id HAVING count(*) > 1) d"))
    return {"p50_ms": 1000 * latencies[len(latencies) // 2], "p95_ms": 1000 * latencies[int(0.95 * n) - 1],
            "max_ms": 1000 * latencies[-1], "all_promised_ms": 1000 * planned,
            "codes": {c: codes.count(c) for c in sorted(set(codes))}, "double_holds": double,
            "recorded": int(psql("SELECT count(*) FROM reservations_reservation")),
            "web_cpu_ms_per_request": 1000 * web_cpu / n, "workers_cpu_ms": 1000 * workers_cpu,
            "postgres_cpu_ms_per_request": 1000 * pg_cpu / n}


def run_tree(tree: Path, args) -> list[dict]:
    tokens = prepare(tree)
    procs, port = start(tree, args.workers)
    try:
        out = []
        for _ in range(args.bursts):
            out.append(burst(port, tokens, args.n, procs, args.floor))
            time.sleep(1)
        return out
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def summary(label: str, results: list[dict]) -> dict:
    return {"tree": label, "bursts": len(results),
            **{k: round(statistics.median(r[k] for r in results), 1)
               for k in ("p50_ms", "p95_ms", "max_ms", "all_promised_ms", "web_cpu_ms_per_request",
                         "workers_cpu_ms", "postgres_cpu_ms_per_request")},
            "worst_p95_ms": round(max(r["p95_ms"] for r in results), 1),
            "codes": {c: sum(r["codes"].get(c, 0) for r in results) for c in
                      sorted({c for r in results for c in r["codes"]})},
            "double_holds": sum(r["double_holds"] for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=50)
    parser.add_argument("--bursts", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--floor", action="store_true", help="the same bursts of GET /api/v1/health (middleware, "
                        "ninja, one SELECT 1): the least a request costs this stack")
    parser.add_argument("--against", metavar="REF")
    parser.add_argument("--rounds", type=int, default=1, help="with --against: turns of each tree")
    args = parser.parse_args()
    print(f"host speed {host_speed_ns():.0f} ns/op, {os.cpu_count()} cores", flush=True)
    trees = [("current", REPO)]
    with tempfile.TemporaryDirectory() as baseline:
        if args.against:
            archive = subprocess.run(["git", "archive", args.against], cwd=REPO, check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", baseline], input=archive, check=True)
            trees.insert(0, (args.against, Path(baseline)))
        results: dict[str, list[dict]] = {label: [] for label, _ in trees}
        for _ in range(args.rounds):
            for label, tree in trees:
                got = run_tree(tree, args)
                for r in got:
                    print({"tree": label, **{k: round(v, 1) if isinstance(v, float) else v for k, v in r.items()}},
                          flush=True)
                results[label] += got
    for label, _ in trees:
        print(summary(label, results[label]))


if __name__ == "__main__":
    main()
