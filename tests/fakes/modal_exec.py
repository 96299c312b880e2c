"""What the Modal fake runs for one call, in its own process as a Modal container would:
`python -m tests.fakes.modal_exec module:attribute OUTPUT` with the pickled `(args, kwargs)` on stdin. Writes the
pickled `(ok, value or exception, traceback)` to OUTPUT; no OUTPUT means the container died."""

import importlib
import pickle
import sys
import traceback

target, output = sys.argv[1], sys.argv[2]
args, kwargs = pickle.loads(sys.stdin.buffer.read())
module, attribute = target.split(":")
function = getattr(importlib.import_module(module), attribute)
function = getattr(function, "local", function)  # a modal Function runs its raw body here, as in its container
try:
    outcome = (True, function(*args, **kwargs), "")
except Exception as exc:
    outcome = (False, exc, traceback.format_exc())
try:
    data = pickle.dumps(outcome)
except Exception:  # Modal too answers an unpicklable exception with its text
    data = pickle.dumps((False, RuntimeError(repr(outcome[1])), outcome[2]))
with open(output, "wb") as f:
    f.write(data)
