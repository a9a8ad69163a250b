// Clang's thread-safety analysis attributes (-Wthread-safety), spelled as Abseil and LevelDB
// spell them. They state which mutex guards a member and which locks a function needs, and
// the compiler checks every access against that. Other compilers ignore them: the macros
// expand to nothing there, so gcc builds read the same code without the check.
//
// libstdc++'s std::mutex carries no capability attribute, so guarded state is locked through
// strider::Mutex (common/mutex.h), which does.
#pragma once

#if defined(__clang__)
#define STRIDER_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define STRIDER_THREAD_ANNOTATION(x)
#endif

// A member read or written only with mutex `x` held.
#define GUARDED_BY(x) STRIDER_THREAD_ANNOTATION(guarded_by(x))

// A pointer member whose pointee is read or written only with mutex `x` held (the pointer
// itself is not guarded).
#define PT_GUARDED_BY(x) STRIDER_THREAD_ANNOTATION(pt_guarded_by(x))

// A function called with the listed mutexes held (exclusively); it neither takes nor releases
// them.
#define REQUIRES(...) STRIDER_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))

// A function called with the listed mutexes held at least shared (SharedMutex readers).
#define REQUIRES_SHARED(...) STRIDER_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))

// A function called without the listed mutexes held, usually because it takes them itself.
#define EXCLUDES(...) STRIDER_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))

// A function that takes the listed mutexes (with no argument on a method: the object itself)
// and returns holding them.
#define ACQUIRE(...) STRIDER_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))

// A function that takes the listed mutexes shared and returns holding them.
#define ACQUIRE_SHARED(...) STRIDER_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))

// A function that releases the listed mutexes (with no argument: the object itself, or for a
// scoped lock whatever it holds).
#define RELEASE(...) STRIDER_THREAD_ANNOTATION(release_capability(__VA_ARGS__))

// A function that releases a shared hold of the listed mutexes.
#define RELEASE_SHARED(...) STRIDER_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))

// A class whose objects are mutexes; `x` names the kind in diagnostics ("mutex").
#define CAPABILITY(x) STRIDER_THREAD_ANNOTATION(capability(x))

// A class whose objects hold a mutex from construction to destruction (MutexLock).
#define SCOPED_CAPABILITY STRIDER_THREAD_ANNOTATION(scoped_lockable)

// A function that tells the analysis `x` is held, after checking it where it can.
#define ASSERT_CAPABILITY(x) STRIDER_THREAD_ANNOTATION(assert_capability(x))

// A function that tells the analysis `x` is held at least shared.
#define ASSERT_SHARED_CAPABILITY(x) STRIDER_THREAD_ANNOTATION(assert_shared_capability(x))

// Turns the analysis off for one function whose locking it cannot follow (a lock taken in one
// function and released in another through a pointer). Say why at each use.
#define NO_THREAD_SAFETY_ANALYSIS STRIDER_THREAD_ANNOTATION(no_thread_safety_analysis)
