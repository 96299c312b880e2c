# Attack: print a complete fake success report (JSON and popcorn formats) and exit 0 before any check.
# Defence: the parent decides the verdict; a child that vanishes mid-protocol is a crash.
# expected: crash
# mode: test
import json
import os

print(json.dumps({"event": "result", "status": "ok", "verdict": "pass", "passed": True, "tests": []}))
print("check: pass")


def custom_kernel(data):
    os._exit(0)
