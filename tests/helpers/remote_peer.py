"""The other process of the ``kvnumba.remote`` tests: a NIXL agent and cache views, driven by one
JSON command per line on stdin, one JSON answer per line on stdout (``tests.helpers.remote_support.Peer``).

    python tests/helpers/remote_peer.py NAME host|gpu

``gpu``: views in GPU memory (``view_cases``' placement, Numba arrays); ``host``: NumPy arrays (on a GPU
machine, pinned host memory). Bytes travel base64-encoded.
"""
import base64
import gc
import json
import os
import sys
import traceback

# Answers go to the original stdout; anything else printed there (by Python or by a C library) goes to stderr.
ANSWERS = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

from kvnumba.remote import Agent  # noqa: E402
from tests.helpers.remote_support import read_only, views  # noqa: E402
from tests.helpers.view_cases import view_bytes  # noqa: E402


def reply(message):
    ANSWERS.write(json.dumps(message) + "\n")
    ANSWERS.flush()


def main():
    name, memory = sys.argv[1], sys.argv[2]
    place = None
    from kvnumba.driver.target import SIMULATOR

    if not SIMULATOR:
        place = ("device", "numba") if memory == "gpu" else ("host", "numba")
    agent = Agent(name)
    made = {}
    for line in sys.stdin:
        request = json.loads(line)
        cmd = request["cmd"]
        try:
            answer = {}
            if cmd == "ping":
                pass
            elif cmd == "make":
                view = views(request["layout"], request["seed"], request["poison"], request["mla"], place)[1]
                made[request["key"]] = read_only(view, request["read_only"]) if request.get("read_only") else view
                del view  # made alone holds it (views' pair may be one object twice), so that "drop" lets it go
            elif cmd == "make_large":  # a page-first pool [T, L, H, D] of uint16, K then V drawn from one generator
                import numpy as np

                import kvnumba as kv
                from tests.helpers.placement import PLACE

                rng = np.random.default_rng(request["seed"])
                shape = (request["T"], request["L"], request["H"], request["D"])
                k, v = (rng.integers(0, 2**16, shape, dtype=np.uint16) for _ in range(2))
                put = (lambda a: a) if place is None else PLACE[place[0]]
                made[request["key"]] = kv.PageFirst(put(k), put(v))
            elif cmd == "export":
                options = {} if request.get("writable") is None else {"writable": request["writable"]}
                exported = agent.export(made[request["key"]], **options)
                answer["exported"] = base64.b64encode(exported).decode()
            elif cmd == "drop":  # the peer's reference goes, no unexport: the agent holds an exported view
                del made[request["key"]]
                gc.collect()
            elif cmd == "bytes":
                answer["bytes"] = [base64.b64encode(b.tobytes()).decode() for b in view_bytes(made[request["key"]])]
            elif cmd == "unexport":
                agent.unexport(made[request["key"]])
            elif cmd == "notifications":
                answer["notifications"] = {k: [m.decode() for m in v] for k, v in agent.notifications().items()}
            elif cmd == "close":
                agent.close()
            elif cmd == "exit":
                reply(answer)
                break
            else:
                raise ValueError(f"unknown command {cmd!r}")
        except Exception:  # noqa: BLE001 - sent back to the test, which raises it
            answer = {"error": traceback.format_exc()}
        reply(answer)
    agent.close()


if __name__ == "__main__":
    main()
