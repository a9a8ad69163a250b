// Child processes that die with the process that started them.
//
// A command that exits normally stops its children itself; one that is SIGKILLed or aborts
// cannot. The kernel's parent-death signal (PR_SET_PDEATHSIG) covers those exits, but it fires
// when the *thread* that forked the child ends, not the process, and environments are started
// from short-lived threads (the actor makes each episode's environment on a thread of its own).
// ForkWithLifeline therefore forks on one thread that lives as long as the process, so the
// signal means exactly "the process that started me is gone".
#pragma once

#include <sys/types.h>

#include <functional>

namespace strider {

// Forks; the child sets SIGKILL as its parent-death signal and runs `in_child`, which must only
// make async-signal-safe calls and end in exec or _exit. Returns the child's pid, or -1 with
// errno set when fork failed. Thread-safe; callers wait while another caller forks.
pid_t ForkWithLifeline(const std::function<void()>& in_child);

}  // namespace strider
