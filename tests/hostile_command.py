"""The external command of the hostile-inputs suite: prints what its payload says, byte for byte.

Payload: {"stdout": spec, "stderr": spec, "exit": code}; a spec is {"bytes": [0..255, ...]} or
{"repeat": [byte, count]} (or absent: nothing).
"""

import json
import sys


def render(spec):
    if not spec:
        return b""
    if "bytes" in spec:
        return bytes(spec["bytes"])
    byte, count = spec["repeat"]
    return bytes([byte]) * count


payload = json.load(sys.stdin)
sys.stderr.buffer.write(render(payload.get("stderr")))
sys.stderr.flush()
sys.stdout.buffer.write(render(payload.get("stdout")))
sys.stdout.flush()
sys.exit(payload.get("exit", 0))
