#!/usr/bin/python3
"""A complete out-of-process Strider environment: guess the number.

Strider starts this program (env: {command: "/usr/bin/python3 envs/external/example_env.py"})
with the address of its socket in the STRIDER_ENV_ENDPOINT environment variable (or as the
first argument). The program connects a ZeroMQ REP socket there and answers one JSON request
at a time until it is asked to close. The protocol is in docs/environments.md.

The game: a secret integer in [1, high] (option `high`, default 100). The model calls the tool
`guess(n)` and hears "higher", "lower" or "correct"; then it answers "Answer: n". A guess is
labelled correct when it lies inside the range the earlier replies still allow (a sensible
guess), incorrect otherwise, so process rewards have ground truth. The outcome reward is 1 for
the right answer within the turn limit.

Needs only the standard library and python3-zmq (Debian: apt-get install python3-zmq).
"""
import json
import os
import random
import re
import sys

import zmq

MAX_TURNS = 20
SPEC = {
    "name": "guess_number",
    "description": "find a secret integer with guess(n), then reply 'Answer: n'",
    "tools": [{"name": "guess", "arguments": {"n": "integer"},
               "description": "says whether the secret is higher, lower or equal"}],
    "max_turns": MAX_TURNS,
    "options": ["high"],
}


class GuessNumber:
    def __init__(self):
        self.secret = None

    def reset(self, seed, options):
        unknown = set(options) - {"high"}
        if unknown:
            raise ValueError("unknown option(s): %s (known: high)" % ", ".join(sorted(unknown)))
        high = int(options.get("high", "100"))
        if high < 1:
            raise ValueError("option 'high' must be at least 1, got %d" % high)
        # The same seed gives the same episode.
        self.secret = random.Random(seed).randint(1, high)
        self.low, self.high = 1, high
        self.turns = 0
        return {"role": "user",
                "text": "I am thinking of an integer from 1 to %d. Use guess(n), "
                        "then reply 'Answer: n'." % high}

    def step(self, action):
        if self.secret is None:
            raise RuntimeError("step before reset")
        self.turns += 1
        reply = {"observation": {"role": "tool_result", "text": ""}, "reward": None,
                 "label": "unknown", "done": False, "outcome_reward": None, "info": {}}
        call = action.get("tool_call")
        if action.get("tool_call_error"):
            # A malformed call is shown to the model as an error result, never a failure.
            self._label(reply, False, "error: " + action["tool_call_error"])
        elif call:
            if call["name"] != "guess":
                self._label(reply, False, "error: unknown tool '%s'" % call["name"])
            else:
                try:
                    n = int(call["arguments"].strip())
                except ValueError:
                    self._label(reply, False, "error: guess takes one integer")
                else:
                    sensible = self.low <= n <= self.high
                    if n < self.secret:
                        text = "higher"
                        self.low = max(self.low, n + 1)
                    elif n > self.secret:
                        text = "lower"
                        self.high = min(self.high, n - 1)
                    else:
                        text = "correct"
                    self._label(reply, sensible, text)
        else:
            match = re.search(r"Answer:\s*(-?\d+)", action.get("text", ""))
            if match:
                right = int(match.group(1)) == self.secret
                reply["observation"] = {"role": "user", "text": ""}
                reply["label"] = "correct" if right else "incorrect"
                reply["reward"] = reply["outcome_reward"] = 1.0 if right else 0.0
                reply["done"] = True
                reply["info"] = {"secret": str(self.secret)}
                self.secret = None
                return reply
            reply["observation"] = {"role": "user", "text": "Call guess(n), or reply 'Answer: n'."}
        if self.turns >= MAX_TURNS:
            reply["done"] = True
            reply["outcome_reward"] = 0.0
            reply["info"] = {"reason": "turn limit"}
            self.secret = None
        return reply

    @staticmethod
    def _label(reply, correct, text):
        reply["observation"]["text"] = text
        reply["label"] = "correct" if correct else "incorrect"
        reply["reward"] = 1.0 if correct else 0.0


def scripted_turn(observations):
    """The scripted policy: binary search. Observations hold the replies but not the guesses,
    so it replays its own midpoint guesses against the replies so far."""
    if not observations:
        raise ValueError("no observations")
    low, high = 1, int(re.search(r"from 1 to (\d+)", observations[0]["text"]).group(1))
    for observation in observations[1:]:
        guess = (low + high) // 2
        if observation["text"] == "correct":
            return "Answer: %d" % guess
        if observation["text"] == "higher":
            low = guess + 1
        elif observation["text"] == "lower":
            high = guess - 1
    return "Let me narrow it down.<|tool_call|>guess(%d)<|tool_call_end|>" % ((low + high) // 2)


def main():
    endpoint = sys.argv[1] if len(sys.argv) > 1 else os.environ["STRIDER_ENV_ENDPOINT"]
    context = zmq.Context()
    socket = context.socket(zmq.REP)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    env = GuessNumber()
    while True:
        raw = socket.recv()
        request_id = None
        try:
            request = json.loads(raw)
            request_id = request.get("id")
            op = request.get("op")
            if op == "describe":
                reply = {"ok": True, "spec": SPEC}
            elif op == "reset":
                reply = {"ok": True,
                         "observation": env.reset(int(request["seed"]), request.get("options", {}))}
            elif op == "step":
                reply = dict(ok=True, **env.step(request["action"]))
            elif op == "scripted_turn":
                reply = {"ok": True, "text": scripted_turn(request["observations"])}
            elif op == "close":
                socket.send_string(json.dumps({"id": request_id, "ok": True}))
                break
            else:
                reply = {"ok": False, "error": "unknown op %r" % op}
        except Exception as error:  # every failure becomes an error reply, never silence
            reply = {"ok": False, "error": "%s: %s" % (type(error).__name__, error)}
        reply["id"] = request_id
        socket.send_string(json.dumps(reply))
    socket.close()
    context.term()


if __name__ == "__main__":
    main()
