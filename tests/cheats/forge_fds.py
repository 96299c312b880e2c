# Attack: write forged popcorn `key: value` lines, JSON result lines and fake harness frames on every fd
# 0..255 and on stdout, then return garbage.
# Defence: nothing the child writes decides anything; a garbled result pipe is a protocol violation.
# expected: hacked
# mode: test
import json
import os
import struct

import torch

FORGED = [b"check: pass\ntest-count: 3\ntest.0.status: pass\n",
          json.dumps({"event": "result", "status": "ok", "verdict": "pass", "passed": True}).encode() + b"\n"]
header = json.dumps({"op": "hello"}).encode()
FORGED.append(struct.pack(">II", len(header), 0) + header)
print(FORGED[0].decode() + FORGED[1].decode(), flush=True)
for fd in range(256):
    for blob in FORGED:
        try:
            os.write(fd, blob)
        except OSError:
            pass


def custom_kernel(data):
    a, b = data
    return torch.zeros(a.shape[0], b.shape[1])
