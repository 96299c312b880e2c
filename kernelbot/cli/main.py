"""`kernelbot`: log in, list leaderboards, submit with live progress, run locally as the platform would, manage
submissions.

Config: <user config dir>/kernelbot/config.json ({"url": ..., "token": ...}); KERNELBOT_URL and
KERNELBOT_TOKEN override it."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from platformdirs import user_config_path
from rich.console import Console
from rich.live import Live
from rich.table import Table

from . import local
from .directives import parse_directives

app = typer.Typer(help="Submit GPU kernels to a kernelbot server.", no_args_is_help=True)
submissions_app = typer.Typer(help="Your submissions.", no_args_is_help=True)
app.add_typer(submissions_app, name="submissions")
console = Console()
DEFAULT_URL = "http://127.0.0.1:8000"


def config_file() -> Path:
    return Path(os.environ.get("KERNELBOT_CONFIG") or user_config_path("kernelbot") / "config.json")


def load_config() -> dict[str, str]:
    path = config_file()
    config = json.loads(path.read_text()) if path.exists() else {}
    config["url"] = os.environ.get("KERNELBOT_URL") or config.get("url") or DEFAULT_URL
    if os.environ.get("KERNELBOT_TOKEN"):
        config["token"] = os.environ["KERNELBOT_TOKEN"]
    return config


def save_config(config: dict[str, str]) -> Path:
    path = config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path


def client(token: str | None = None, *, need_token: bool = True) -> httpx.Client:
    config = load_config()
    token = token or config.get("token")
    if need_token and not token:
        fail("Not logged in: run `kernelbot login` first.")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=config["url"].rstrip("/") + "/api/v1", headers=headers, timeout=60)


def fail(message: str, code: int = 1) -> None:
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def check(response: httpx.Response) -> Any:
    if response.is_success:
        return response.json() if response.content else None
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = None
    if not isinstance(detail, str):
        detail = response.text
    retry = response.headers.get("Retry-After")
    fail(f"{detail} (HTTP {response.status_code}{f', retry after {retry} s' if retry else ''})")


@app.command()
def login(url: str = typer.Option(None, help="Server base URL, e.g. https://kernelbot.example.org"),
          token: str = typer.Option(None, help="An API token from the site's token page."),
          username: str = typer.Option(None, help="Trade a site password for a token."),
          password: str = typer.Option(None, help="With --username; prompted when omitted.")) -> None:
    """Store a token for a server: --token, --username/--password, or (neither) link via the browser."""
    config = load_config()
    if url:
        config["url"] = url.rstrip("/")
    save_config(config)
    if username:
        password = password or typer.prompt("Password", hide_input=True)
        with client(need_token=False) as c:
            token = check(c.post("/auth/password", json={"username": username, "password": password}))["token"]
    elif not token:
        with client(need_token=False) as c:
            started = check(c.post("/auth/cli"))
        console.print(f"Open [bold]{started['link_url']}[/bold], log in and paste this id:\n\n"
                      f"  {started['cli_id']}\n\nWaiting for the link…")
        token = started["cli_id"]
        with client(token) as c:
            while c.get("/me").status_code == 401:
                time.sleep(2)
    with client(token) as c:
        me = check(c.get("/me"))
    config["token"] = token
    path = save_config(config)
    console.print(f"Logged in to {config['url']} as [bold]{me['username']}[/bold] (config: {path}).")


@app.command()
def leaderboards() -> None:
    """List the leaderboards with their GPU types and deadlines."""
    with client(need_token=False) as c:
        rows = check(c.get("/leaderboards"))
    table = Table("name", "GPU types", "deadline", "lang", "open")
    for b in rows:
        table.add_row(b["name"], ", ".join(b["gpu_types"]), b["deadline"][:16].replace("T", " "), b["lang"],
                      "yes" if b["is_open"] else "no")
    console.print(table)


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1e6:.2f} µs" if value < 1e-3 else f"{value * 1e3:.3f} ms"


def status_table(sub: dict[str, Any]) -> Table:
    table = Table(title=f"#{sub['id']} {sub['file_name']} → {sub['leaderboard']} ({sub['mode']}): {sub['status']}")
    for column in ("GPU", "run", "status", "tests", "score", "detail"):
        table.add_column(column)
    for run in sub["runs"]:
        tests = run["tests"]
        passed = sum(t["status"] == "pass" for t in tests)
        progress, finished = run["progress"], run.get("outcome") is not None
        # a finished run shows its result, never the last progress it reported on the way
        detail = run["error"][:80] or ("" if finished or not progress.get("phase") else
                                       f"{progress['phase']} {progress.get('done', '')}/{progress.get('total', '')}")
        if not detail and finished and run["outcome"] != "passed":  # a secret run: its outcome class only
            detail = run["outcome"].replace("_", " ")
        table.add_row(run["gpu"], "secret" if run["secret"] else "public", run["status"],
                      f"{passed}/{len(tests)}" if tests else "-", fmt_seconds(run["score"]), detail)
    queue = sub.get("queue")
    if queue and not sub["done"]:
        table.caption = f"queue position {queue['position']} on {queue['gpu']}, ETA ~{queue['eta_seconds']} s"
    elif sub.get("score") is not None:  # the board's score: the run that ranks lower, not always the longer time
        table.caption = f"score {fmt_seconds(sub['score'])}" + (
            " (the time of the run that ranks lower)" if sub["mode"] == "leaderboard" else "")
    return table


def follow(c: httpx.Client, submission_id: int, initial: dict[str, Any]) -> dict[str, Any]:
    """Live display from the server-sent progress stream; falls back to polling if the stream breaks."""
    latest = initial
    with Live(status_table(latest), console=console, refresh_per_second=4) as live:
        try:
            with c.stream("GET", f"/submissions/{submission_id}/events", timeout=None) as stream:
                event = None
                for line in stream.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:") and event == "submission":
                        latest = json.loads(line[5:])
                        live.update(status_table(latest))
                    elif line.startswith("data:") and event in ("done", "error"):
                        break
        except httpx.HTTPError:
            pass
        while not latest["done"]:
            time.sleep(2)
            latest = check(c.get(f"/submissions/{submission_id}"))
            live.update(status_table(latest))
    return latest


@app.command()
def submit(file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
           leaderboard: str = typer.Option(None, "--leaderboard", "-l", help="Default: #!POPCORN leaderboard."),
           gpu: str = typer.Option(None, "--gpu", "-g", help="Default: #!POPCORN gpu."),
           mode: str = typer.Option("leaderboard", "--mode", "-m", help="test, benchmark, leaderboard or profile."),
           wait: bool = typer.Option(True, help="Follow the progress until the result.")) -> None:
    """Submit FILE and show live progress and the result table."""
    content = file.read_bytes()
    found = parse_directives(content.decode("utf-8", errors="replace"))
    leaderboard = leaderboard or found.get("leaderboard")
    gpu = gpu or found.get("gpu")
    if not leaderboard:
        fail("Name a leaderboard with --leaderboard or a `#!POPCORN leaderboard <name>` line.")
    data = {"leaderboard": leaderboard, "mode": mode, **({"gpu": gpu} if gpu else {})}
    with client() as c:
        sub = check(c.post("/submissions", data=data, files={"file": (file.name, content)}))
        console.print(f"Submitted #{sub['id']} to {leaderboard} ({mode}).")
        if wait:
            sub = follow(c, sub["id"], sub)
    if sub["status"] not in ("succeeded", "pending", "running"):
        raise typer.Exit(2)


def fmt_ns(value: float | None) -> str:
    return "-" if value is None else fmt_seconds(value / 1e9)


def case_tables(result: dict[str, Any]) -> list[Table]:
    """The run's cases as the submission page shows them: tests with the checker's message, then benchmarks."""
    tables = []
    if result.get("tests"):
        tests = Table("case", "verdict", "checker message", title="Tests", title_justify="left")
        for case in result["tests"]:
            tests.add_row(case["spec"], case["status"], case.get("message", ""))
        tables.append(tests)
    for phase, title in (("benchmarks", "Benchmarks"), ("ranked", "Ranked benchmarks")):
        if not result.get(phase):
            continue
        table = Table("case", "time", "95 % interval", "× reference", "best", "samples", "stopped because",
                      title=title, title_justify="left")
        for b in result[phase]:
            timed = b.get("time") is not None
            value, low, high = (b.get("time"), b.get("time_low"), b.get("time_high")) if timed else (
                b.get("mean"), b.get("ci_low"), b.get("ci_high"))
            ratio = f"{b['ratio']:.3f}×" if timed and b.get("ratio") is not None else "-"
            table.add_row(b["spec"], fmt_ns(value), f"{fmt_ns(low)} – {fmt_ns(high)}", ratio, fmt_ns(b.get("best")),
                          str(b.get("runs", "-")), b.get("stop_reason") or "-")
        tables.append(table)
    return tables


def sandbox_line(result: dict[str, Any]) -> str:
    box = (result.get("system") or {}).get("sandbox") or {}
    if box.get("backend") == "bubblewrap":
        return (f"sandbox: bubblewrap (network {box.get('network')}, {box.get('filesystem')}, "
                f"killed by {box.get('tree_kill')})")
    why = box.get("fallback_reason") or box.get("error") or "bubblewrap is not available"
    return (f"[yellow]not sandboxed:[/yellow] {box.get('backend', 'unknown')} ({why}); the submission ran with "
            "your user's rights, its network and your files (install bubblewrap to isolate it)")


@app.command("run")
def run_(file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
         leaderboard: str = typer.Option(None, "--leaderboard", "-l", help="Default: #!POPCORN leaderboard."),
         problem: Annotated[Path | None, typer.Option(
             "--problem", file_okay=False, exists=True,
             help="A local reference-kernels task directory (task.yml); no server.")] = None,
         mode: str = typer.Option("test", "--mode", "-m", help="test or benchmark."),
         gpu: int = typer.Option(None, "--gpu", min=0, help="This machine's GPU to use (default: 0 if there is one)."),
         python: str = typer.Option(sys.executable, help="The Python (with torch) that runs the harness."),
         as_json: bool = typer.Option(False, "--json", help="Print the harness's result as one JSON line.")) -> None:
    """Run FILE here as the platform would, with the task's public inputs: the leaderboard's task and the server's
    harness are downloaded once (cached per problem version, used offline), or --problem DIR runs a local task."""
    code = file.read_text(encoding="utf-8", errors="replace")
    out = Console(stderr=True) if as_json else console
    try:
        if problem is not None:
            task = local.directory_task(problem)
        else:
            leaderboard = leaderboard or parse_directives(code).get("leaderboard")
            if not leaderboard:
                fail("Name a leaderboard with --leaderboard, a `#!POPCORN leaderboard <name>` line, or a task with "
                     "--problem DIR.")
            config = load_config()
            with client(need_token=False) as c:
                task = local.server_task(c, config["url"], leaderboard)
        shown = task.problem
        version = f" v{shown['version']}" if shown.get("version") else ""
        out.print(f"{task.name}: problem {shown.get('name')}{version} ({shown.get('content_hash', '')[:12]}) from "
                  f"{task.origin}")
        with out.status(f"running {file.name} ({mode})…") as status:
            result = local.run_task(task, code, mode, gpus=local.default_gpus() if gpu is None else [str(gpu)],
                                    python=python, on_progress=lambda e: status.update(
                                        f"running {file.name}: {e.get('phase')} {e.get('done')}/{e.get('total')}"))
    except local.LocalRunError as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps(result))
    out.print(sandbox_line(result))
    for table in case_tables(result):
        out.print(table)
    if result.get("status") != "ok":
        out.print(f"[red]harness error[/red] (not your code's verdict): {result.get('error')}")
        raise typer.Exit(1)
    ranking_by = task.bundle["jobs"][mode]["job"]["ranking_by"]
    score = local.local_score(result, ranking_by)
    summary = f"verdict: {result['verdict']}" + (f", score {fmt_seconds(score)} ({ranking_by})" if score else "")
    out.print(f"{'[green]' if result['passed'] else '[red]'}{summary}[/] in {result['wall_s']:.1f} s")
    if result.get("error"):
        out.print(result["error"])
    if not result["passed"]:
        raise typer.Exit(2)


@submissions_app.command("list")
def list_(leaderboard: str = typer.Option("", "--leaderboard", "-l"), limit: int = 20) -> None:
    """Your latest submissions."""
    with client() as c:
        page = check(c.get("/submissions", params={"leaderboard": leaderboard, "limit": limit}))
    table = Table("id", "leaderboard", "file", "mode", "submitted", "status", "score")
    for s in page["results"]:
        table.add_row(str(s["id"]), s["leaderboard"], s["file_name"], s["mode"], s["created"][:19].replace("T", " "),
                      s["status"], fmt_seconds(s["score"]))
    console.print(table)


@submissions_app.command()
def show(submission_id: int) -> None:
    """One submission's status and per-run results."""
    with client() as c:
        sub = check(c.get(f"/submissions/{submission_id}"))
    if rerun := sub.get("rerun_of"):  # a final standings' re-run, made by the platform: not one of the user's own
        console.print(f"#{sub['id']} is re-run {rerun['round']} of #{rerun['submission_id']} for the final standings "
                      "(made by the platform after the deadline; ranked on no board).", soft_wrap=True)
    console.print(status_table(sub))


@submissions_app.command()
def delete(submission_id: int, yes: bool = typer.Option(False, "--yes", "-y")) -> None:
    """Delete one of your submissions."""
    if not yes:
        typer.confirm(f"Delete submission {submission_id}?", abort=True)
    with client() as c:
        check(c.delete(f"/submissions/{submission_id}"))
    console.print(f"Deleted submission {submission_id}.")


from .gpus import app as gpus_app  # noqa: E402 - it imports this module's helpers

app.add_typer(gpus_app, name="gpus")

if __name__ == "__main__":
    app()
