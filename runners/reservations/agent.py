"""The node agent: reads `nvidia-smi` every interval and posts the readings to /api/v1/gpus/samples. Plain Python
(stdlib only, no Django), run on each GPU node:

    KERNELBOT_NODE_AGENT_TOKEN=… python -m runners.reservations.agent --url https://kb.example.org \
        --pool lab --hostname "$(hostname -s)" --interval 60
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import time
import urllib.error
import urllib.request

QUERY = ["--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
log = logging.getLogger("kernelbot.agent")


def read(nvidia_smi: str = "nvidia-smi") -> list[dict]:
    out = subprocess.run([nvidia_smi, *QUERY], capture_output=True, text=True, timeout=30, check=True).stdout
    samples = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            samples.append({"index": int(parts[0]), "utilization": float(parts[1]),
                            "memory_used_mib": int(float(parts[2]))})
        except ValueError:  # "[N/A]" on some devices
            continue
    return samples


def post(url: str, token: str, pool: str, hostname: str, samples: list[dict]) -> int:
    body = json.dumps({"pool": pool, "hostname": hostname, "samples": samples}).encode()
    request = urllib.request.Request(url.rstrip("/") + "/api/v1/gpus/samples", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["stored"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--pool", required=True)
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--interval", type=float, default=60)
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    parser.add_argument("--once", action="store_true")
    args = parser.parse_args(argv)
    token = os.environ.get("KERNELBOT_NODE_AGENT_TOKEN", "")
    while True:
        try:
            stored = post(args.url, token, args.pool, args.hostname, read(args.nvidia_smi))
            log.info("posted %s samples", stored)
        except (OSError, subprocess.SubprocessError, urllib.error.URLError, ValueError) as exc:
            log.warning("sample not posted: %s", exc)
            if args.once:
                return 1
        if args.once:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    raise SystemExit(main())
