"""`kernelbot gpus …`: availability, reserve (a live status line until active), list, show, cancel, extend, and
`keys` (the SSH public keys placed on reserved nodes)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from kernelbot.durations import parse_minutes

app = typer.Typer(help="Reserve shared GPUs.", no_args_is_help=True)

# main.py adds `app` at its end: defined before this import, so `python -m kernelbot.cli.main` (which loads main twice)
# finds it too
from .main import check, client, console  # noqa: E402

PLANNING_WAIT_S = 15  # how long `reserve` waits for the planning pass that follows its request (seconds at most)


def when(value: str | None) -> str:
    if not value:
        return "-"
    moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    left = (moment - datetime.now(UTC)).total_seconds()
    rel = f"in {left / 60:.0f} min" if left > 0 else "now"
    return f"{moment:%Y-%m-%d %H:%M} UTC ({rel})"


def parse_duration(text: str) -> int:
    """Minutes from `90`, `90m`, `2h`, `1h30m`, `0.25h`."""
    try:
        return parse_minutes(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def status_line(r: dict[str, Any]) -> str:
    nodes = f" × {r['nodes']} nodes" if r.get("nodes", 1) > 1 else ""
    base = f"#{r['id']} {r['gpu_count']}× {r['gpu_type']}{nodes} on {r['pool']} ({r['project']}): {r['status']}"
    if r["status"] == "pending":
        return f"{base}, " + (f"starts {when(r['planned_start'])}" if r["planned_start"] else "being planned")
    if r["status"] == "active":
        hosts = ",".join(r.get("hostnames") or [r["hostname"]])
        return f"{base} on {hosts} GPUs {','.join(map(str, r['gpus']))} until {when(r['ends_at'])}"
    return base + (f": {r['failure']}" if r["failure"] else "")


def show_access(r: dict[str, Any]) -> None:
    if r["status"] == "active" and r["access"].get("note"):
        console.print(f"[bold]Access:[/bold] {r['access']['note']}")
    warnings = [e for e in r["events"] if e["kind"] == "warning"]
    if warnings and r["status"] == "active":
        console.print(f"[yellow]{warnings[-1]['message']}[/yellow]")


@app.command()
def availability(minutes: int = typer.Option(60, help="Duration the ETAs assume.")) -> None:
    """Free devices, queued requests and the ETA for 1/2/4/8 GPUs, per pool and GPU type."""
    with client() as c:
        rows = check(c.get("/gpus/availability", params={"minutes": minutes}))
    table = Table("GPU", "pool", "devices", "reservable", "free now", "queued", "ETA 1", "ETA 2", "ETA 4", "ETA 8")
    for a in rows:
        table.add_row(a["gpu_type"], a["pool"], str(a["devices"]), str(a["reservable"]), str(a["free_now"]),
                      str(a["queued"]), *(when(a["eta"].get(k)) if a["eta"].get(k) else "never"
                                          for k in ("1", "2", "4", "8")))
    console.print(table)


@app.command()
def reserve(gpus: int = typer.Option(1, "--gpus", "-n", help="GPUs on each node."),
            nodes: int = typer.Option(1, "--nodes", "-N", help="Nodes of one pool, all or nothing."),
            gpu_type: str = typer.Option(..., "--gpu", "-g", help="GPU type, e.g. H100."),
            duration: str = typer.Option("1h", "--duration", "-d", help="e.g. 90m, 2h, 1h30m, 0.25h."),
            project: str = typer.Option("", "--project", "-p", help="Label for usage reports."),
            pool: str = typer.Option("", help="A pool (default: the one that starts it first)."),
            wait: bool = typer.Option(True, help="Wait with a live status line until it is active.")) -> None:
    """Reserve GPUs; queued when none are free."""
    body = {"gpu_type": gpu_type, "gpu_count": gpus, "minutes": parse_duration(duration), "project": project,
            "pool": pool, "nodes": nodes}
    with client() as c:
        r = check(c.post("/gpus/reservations", json=body))
        planning = time.monotonic() + PLANNING_WAIT_S  # the answer comes before its planning pass
        while r["status"] == "pending" and r["planned_start"] is None and time.monotonic() < planning:
            time.sleep(0.1)
            r = check(c.get(f"/gpus/reservations/{r['id']}"))
        if r["status"] == "pending":
            console.print(f"Queued: reservation #{r['id']}, expected start {when(r['planned_start'])}.")
        if wait and r["status"] == "pending":
            with console.status(status_line(r)) as line:
                while r["status"] == "pending":
                    time.sleep(2)
                    r = check(c.get(f"/gpus/reservations/{r['id']}"))
                    line.update(status_line(r))
    console.print(status_line(r))
    show_access(r)
    if r["status"] not in ("active", "pending"):
        raise typer.Exit(2)


@app.command("list")
def list_(all: bool = typer.Option(False, "--all", help="Finished ones too.")) -> None:
    """Your reservations."""
    with client() as c:
        rows = check(c.get("/gpus/reservations", params={"all": all}))
    table = Table("id", "GPUs", "pool", "project", "status", "host", "starts", "ends")
    for r in rows:
        table.add_row(str(r["id"]), f"{r['gpu_count']}× {r['gpu_type']}", r["pool"], r["project"], r["status"],
                      r["hostname"] or "-", when(r["started_at"] or r["planned_start"]), when(r["ends_at"]))
    console.print(table)
    for r in rows:
        show_access(r)


@app.command()
def show(reservation_id: int) -> None:
    """One reservation with its events."""
    with client() as c:
        r = check(c.get(f"/gpus/reservations/{reservation_id}"))
    console.print(status_line(r))
    show_access(r)
    for e in r["events"]:
        console.print(f"  {e['created'][:16].replace('T', ' ')} {e['kind']}: {e['message']}")


@app.command()
def cancel(reservation_id: int | None = typer.Argument(None, help="Which; without it, choose among yours.")) -> None:
    """Cancel a queued request or end an active reservation now."""
    with client() as c:
        if reservation_id is None:
            mine = check(c.get("/gpus/reservations"))
            if not mine:
                console.print("You hold no open reservations.")
                raise typer.Exit(1)
            for n, r in enumerate(mine, 1):
                console.print(f"{n}. {status_line(r)}")
            choice = typer.prompt("Cancel which (a number; empty: none)", default="", show_default=False).strip()
            if not choice:
                raise typer.Exit(0)
            if not choice.isdigit() or not 1 <= int(choice) <= len(mine):
                raise typer.BadParameter(f"'{choice}' is not one of 1-{len(mine)}")
            reservation_id = mine[int(choice) - 1]["id"]
        r = check(c.post(f"/gpus/reservations/{reservation_id}/cancel"))
    console.print(status_line(r))


@app.command()
def extend(reservation_id: int, duration: str = typer.Argument(..., help="More time, e.g. 30m, 1h.")) -> None:
    """Add time (refused when it would delay someone queued past the pool's policy)."""
    with client() as c:
        r = check(c.post(f"/gpus/reservations/{reservation_id}/extend", json={"minutes": parse_duration(duration)}))
    console.print(status_line(r))


keys_app = typer.Typer(help="Your SSH public keys, placed on the nodes of your reservations (Slurm pools).",
                       no_args_is_help=True)
app.add_typer(keys_app, name="keys")


def keys_table(rows: list[dict[str, Any]]) -> None:
    table = Table("id", "title", "fingerprint", "source", "added")
    for k in rows:
        source = f"github ({k['github_login']})" if k["source"] == "github" else k["source"]
        table.add_row(str(k["id"]), k["title"], k["fingerprint"], source, k["created"][:16].replace("T", " "))
    console.print(table)


@keys_app.command("list")
def keys_list() -> None:
    """Your SSH public keys."""
    with client() as c:
        keys_table(check(c.get("/gpus/keys")))


@keys_app.command("add")
def keys_add(file: str = typer.Argument("~/.ssh/id_ed25519.pub", help="A public key file (.pub)."),
             title: str = typer.Option("", help="Default: the key's comment.")) -> None:
    """Add a public key (never the private one: a file without .pub is refused here)."""
    path = Path(file).expanduser()
    if not path.name.endswith(".pub"):
        raise typer.BadParameter(f"{file} is not a .pub file; give the public key (e.g. {file}.pub).")
    try:
        text = path.read_text(errors="replace").strip()
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {file}: {exc.strerror}") from None
    with client() as c:
        k = check(c.post("/gpus/keys", json={"key": text, "title": title}))
    console.print(f"Added key #{k['id']} {k['fingerprint']} ({k['title'] or 'no title'}).")


@keys_app.command("remove")
def keys_remove(key_id: int) -> None:
    """Remove a key (reservations already running keep the keys they started with)."""
    with client() as c:
        check(c.delete(f"/gpus/keys/{key_id}"))
    console.print(f"Removed key #{key_id}.")


@keys_app.command("import-github")
def keys_import_github(login: str) -> None:
    """Import the keys GitHub lists for LOGIN, replacing those imported from it before."""
    with client() as c:
        out = check(c.post("/gpus/keys/github", json={"login": login}))
    console.print(f"Imported {len(out['keys'])} key(s) from GitHub user {login}.")
    for why in out["skipped"]:
        console.print(f"[yellow]skipped[/yellow] {why}")
    if out["keys"]:
        keys_table(out["keys"])
