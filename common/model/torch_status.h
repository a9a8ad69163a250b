// LibTorch reports failures (a shape mismatch, an allocation refused, a collective whose peer is
// gone) by throwing: c10::Error from ATen, std::exception subclasses from parts of c10d and Gloo.
// Strider passes errors as values (common/status.h). This header is the one place where code that
// calls LibTorch turns the first into the second (Guarded, GuardedWith, ThrownMessage), so no
// exception leaves the model layer, the rollout engine or the learner, and no other code catches
// c10::Error or catches std::exception around a LibTorch call.
// For LibTorch code only (model, kernels, rollout_engine, learner, and their tests and
// benchmarks): code that does not link LibTorch has no exception to convert.
// Running out of memory (c10::OutOfMemoryError, or a CUDA call failing for memory) becomes
// ResourceExhausted naming the setting to lower: the one an OutOfMemoryAdvice in scope names.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "common/status.h"

namespace strider::model {

// Names, for one scope on one thread, the setting that bounds the memory of the work inside it
// ("engine.max_batch_tokens of the actor config"): an out-of-memory error raised there tells the
// user what to lower. Scopes nest; the innermost wins.
class OutOfMemoryAdvice {
 public:
  explicit OutOfMemoryAdvice(std::string setting)
      : setting_(std::move(setting)), previous_(current_) {
    current_ = &setting_;
  }
  ~OutOfMemoryAdvice() { current_ = previous_; }
  OutOfMemoryAdvice(const OutOfMemoryAdvice&) = delete;
  OutOfMemoryAdvice& operator=(const OutOfMemoryAdvice&) = delete;

  // The innermost scope's setting, or a generic one outside every scope.
  static std::string Setting() {
    return current_ != nullptr ? *current_ : std::string("the batch size or sequence length");
  }

 private:
  std::string setting_;
  const std::string* previous_;
  static inline thread_local const std::string* current_ = nullptr;
};

namespace guarded_internal {

// CUDA reports memory running out through the caching allocator (c10::OutOfMemoryError) but
// also through library calls checked as plain c10::Error (cuBLAS workspaces, raw cudaMalloc).
inline bool IsOutOfMemory(std::string_view message) {
  return message.find("CUDA out of memory") != std::string_view::npos ||
         message.find("CUDA error: out of memory") != std::string_view::npos ||
         message.find("CUBLAS_STATUS_ALLOC_FAILED") != std::string_view::npos;
}

// The message of an out-of-memory error: what ran out and what to lower, then LibTorch's text.
inline std::string OutOfMemoryText(std::string_view message) {
  std::string text = "out of memory; lower ";
  text += OutOfMemoryAdvice::Setting();
  text += " (";
  text += message;
  text += ")";
  return text;
}

// std::remove_cvref_t is C++20; the fuzz build compiles LibTorch code as C++17 with clang.
template <typename T>
using Bare = std::remove_cv_t<std::remove_reference_t<T>>;

// What a guarded call returns: a Status or Result<T> as the function does, Status for a function
// returning nothing, and Result<T> for a function returning a plain T.
template <typename T>
struct Returned {
  using type = Result<Bare<T>>;
};
template <>
struct Returned<void> {
  using type = Status;
};
template <>
struct Returned<Status> {
  using type = Status;
};
template <typename T>
struct Returned<Result<T>> {
  using type = Result<T>;
};

}  // namespace guarded_internal

template <typename Function>
using GuardedResult =
    typename guarded_internal::Returned<
        guarded_internal::Bare<std::invoke_result_t<Function&>>>::type;

// Runs `function` and returns what it returns, or the Status `on_error(message)` builds from the
// message of the exception it throws (a c10::Error's without its C++ backtrace, which names
// LibTorch's frames, not ours). For callers whose failure is not an Internal error, such as a
// collective that finds a peer gone.
template <typename Function, typename OnError>
GuardedResult<Function> GuardedWith(Function&& function, OnError&& on_error) {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<Function&>>) {
      function();
      return Status::Ok();
    } else {
      return function();
    }
  } catch (const c10::OutOfMemoryError& error) {
    const std::string text = guarded_internal::OutOfMemoryText(error.what_without_backtrace());
    const Status status(on_error(std::string_view(text)));
    return Status(StatusCode::kResourceExhausted, status.message());
  } catch (const c10::Error& error) {
    const std::string_view message = error.what_without_backtrace();
    if (guarded_internal::IsOutOfMemory(message)) {
      const Status status(on_error(guarded_internal::OutOfMemoryText(message)));
      return Status(StatusCode::kResourceExhausted, status.message());
    }
    return Status(on_error(message));
  } catch (const std::exception& error) {
    return Status(on_error(std::string_view(error.what())));
  }
}

// `code` naming `what` and the exception's message when `function` throws.
template <typename Function>
GuardedResult<Function> Guarded(StatusCode code, std::string_view what, Function&& function) {
  return GuardedWith(std::forward<Function>(function), [&](std::string_view message) {
    std::string text(what);
    text += ": ";
    text += message;
    return Status(code, std::move(text));
  });
}

// Runs `function` and returns what it returns (a Status or Result<T>; Status::Ok() for a
// function returning nothing; Result<T> for one returning a T), or Internal naming `what` and the
// exception's message when it throws.
template <typename Function>
GuardedResult<Function> Guarded(std::string_view what, Function&& function) {
  return Guarded(StatusCode::kInternal, what, std::forward<Function>(function));
}

// Runs `function`, which returns nothing, and returns the message of the exception it throws
// (as GuardedWith gives it), or nothing when it returns. For callers that only record a failure
// to report later, such as a gradient bucket sent from inside backward.
template <typename Function>
std::optional<std::string> ThrownMessage(Function&& function) {
  static_assert(std::is_void_v<std::invoke_result_t<Function&>>,
                "ThrownMessage drops a result; use Guarded for a function that returns one");
  std::optional<std::string> message;
  static_cast<void>(GuardedWith(std::forward<Function>(function), [&](std::string_view text) {
    message.emplace(text);
    return Status(StatusCode::kInternal, std::string(text));
  }));
  return message;
}

}  // namespace strider::model
