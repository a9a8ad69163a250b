#!/usr/bin/python3
"""An out-of-process environment that misbehaves on demand, for the client's fault tests.

Reset option `fault` picks what happens at the first step: none (a normal one-step episode),
crash (the process exits), hang (no reply), garbage (a reply that is not JSON), bad_shape (JSON
without the step fields), error (an {"ok": false} reply), kill_group (the process kills itself
with SIGKILL), bad_utf8 (a reply holding bytes that are not UTF-8).
"""
import json
import os
import signal
import sys
import time

import zmq

SPEC = {"name": "faulty", "description": "misbehaves on demand", "tools": [], "max_turns": 4,
        "options": ["fault"]}


def main():
    context = zmq.Context()
    socket = context.socket(zmq.REP)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(os.environ["STRIDER_ENV_ENDPOINT"])
    fault = "none"
    while True:
        request = json.loads(socket.recv())
        op, rid = request["op"], request["id"]
        if op == "describe":
            reply = {"ok": True, "spec": SPEC}
        elif op == "reset":
            fault = request["options"].get("fault", "none")
            reply = {"ok": True, "observation": {"role": "user", "text": "pid %d" % os.getpid()}}
        elif op == "step":
            if fault == "crash":
                sys.exit(3)
            if fault == "kill_group":
                os.kill(os.getpid(), signal.SIGKILL)
            if fault == "hang":
                time.sleep(3600)
            if fault == "garbage":
                socket.send(b"this is not json {")
                continue
            if fault == "bad_utf8":
                socket.send(b'{"id": %d, "ok": true, "observation": {"role": "user", "text": "\xff\xfe"}}'
                            % rid)
                continue
            if fault == "bad_shape":
                reply = {"ok": True, "observation": {"role": "narrator", "text": 5}}
            elif fault == "error":
                reply = {"ok": False, "error": "the environment could not score this turn"}
            else:
                reply = {"ok": True, "observation": {"role": "user", "text": ""}, "done": True,
                         "outcome_reward": 1.0, "label": "correct", "reward": 1.0}
        elif op == "close":
            socket.send_string(json.dumps({"id": rid, "ok": True}))
            return
        else:
            reply = {"ok": False, "error": "unknown op %r" % op}
        reply["id"] = rid
        socket.send_string(json.dumps(reply))


if __name__ == "__main__":
    main()
