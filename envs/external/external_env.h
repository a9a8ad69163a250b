// Out-of-process environments (plug-in path 2): a child process started from `command` that
// answers JSON requests over ZeroMQ (protocol in docs/environments.md, example in
// example_env.py). Internal to envs/: the registry calls it for `env: {command: ...}`.
//
// The client binds a DEALER socket on tcp://127.0.0.1 (a free port) and starts
// `/bin/sh -c COMMAND` in its own process group with the endpoint in STRIDER_ENV_ENDPOINT; the
// process connects a REP socket there. Every request carries an id and waits at most
// step_timeout_ms for the reply with that id (stale replies are dropped).
//
// Faults end the episode, never the caller: a reply that is late, not JSON, of the wrong shape
// or {"ok": false}, or the process exiting, makes Reset/Step return an error naming the fault
// and the process is killed; the next Reset starts a fresh process.
#pragma once

#include <memory>

#include "common/status.h"
#include "envs/environment.h"

namespace strider::envs {

// Starts the process and asks `describe` (waiting up to max(step_timeout_ms, 10 s) for a
// process that is still starting).
Result<std::unique_ptr<Environment>> MakeExternalEnvironment(const EnvironmentConfig& config);
// A policy asking the process's optional `scripted_turn`; Unimplemented if it has none.
Result<std::unique_ptr<ScriptedPolicy>> MakeExternalPolicy(const EnvironmentConfig& config);

}  // namespace strider::envs
