// LibTorch reports failures (a shape mismatch, an allocation refused) by throwing c10::Error;
// Strider passes errors as values (common/status.h). Guarded is the one place where the code
// that calls LibTorch turns the first into the second, so no exception leaves the model layer
// or the rollout engine. LibTorch code only: model, kernels, rollout_engine.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <type_traits>

#include "common/status.h"

namespace strider::model {

// Runs `function` and returns what it returns (a Status or Result<T>; Status::Ok() for a
// function returning nothing), or Internal naming `what` and the exception's message when it
// throws.
template <typename Function>
auto Guarded(const char* what, Function&& function)
    -> std::conditional_t<std::is_void_v<decltype(function())>, Status, decltype(function())> {
  try {
    if constexpr (std::is_void_v<decltype(function())>) {
      function();
      return Status::Ok();
    } else {
      return function();
    }
  } catch (const c10::Error& error) {
    return Status::Internal(std::string(what) + ": " + error.what_without_backtrace());
  } catch (const std::exception& error) {
    return Status::Internal(std::string(what) + ": " + error.what());
  }
}

}  // namespace strider::model
