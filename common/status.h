// Errors as values across component boundaries.
//
// A Status is either OK or a code plus a message that names what was at fault (a file, a config
// key, a peer, a field). Result<T> holds a value or a non-OK Status. Exceptions never cross a
// component's public interface; LibTorch's c10::Error is caught at the model boundary and turned
// into a Status there.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace strider {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // bad input from a caller or user: config, CLI flag, request
  kNotFound,            // a key, file, sequence or peer that does not exist
  kAlreadyExists,
  kCorruption,          // stored or received bytes that fail validation
  kIoError,             // the operating system said no
  kUnavailable,         // a peer is unreachable or timed out; retrying may work
  kResourceExhausted,   // a budget (memory pool, credit, capacity) is full
  kFailedPrecondition,  // the object is not in a state that allows the call
  kOutOfRange,
  kUnimplemented,
  kInternal,            // a broken invariant of our own
  kDeadlineExceeded,    // a time limit of ours fired before the peer answered
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
  static Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status FailedPrecondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
  static Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status DeadlineExceeded(std::string m) {
    return {StatusCode::kDeadlineExceeded, std::move(m)};
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  bool IsNotFound() const { return code_ == StatusCode::kNotFound; }
  bool IsInvalidArgument() const { return code_ == StatusCode::kInvalidArgument; }
  bool IsCorruption() const { return code_ == StatusCode::kCorruption; }

  // "InvalidArgument: configs/model/tiny.yaml: model.heads: ..." style text for logs and stderr.
  std::string ToString() const;

  // The same status with "context: " put in front of the message; OK stays OK.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or the reason there is none. Accessing the value of a failed Result aborts: callers
// check ok() first or use STRIDER_ASSIGN_OR_RETURN.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(data_).ok()) {
      data_ = Status::Internal("Result constructed from an OK status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(data_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(data_); }

  T& value() & { return Checked(); }
  const T& value() const& { return const_cast<Result*>(this)->Checked(); }
  T&& value() && { return std::move(Checked()); }
  T& operator*() & { return Checked(); }
  const T& operator*() const& { return const_cast<Result*>(this)->Checked(); }
  T* operator->() { return &Checked(); }
  const T* operator->() const { return &const_cast<Result*>(this)->Checked(); }

 private:
  T& Checked() {
    if (!ok()) AbortOnBadAccess(std::get<Status>(data_));
    return std::get<T>(data_);
  }
  [[noreturn]] static void AbortOnBadAccess(const Status& status);

  std::variant<T, Status> data_;
};

[[noreturn]] void AbortWithStatus(const char* what, const Status& status);

template <typename T>
void Result<T>::AbortOnBadAccess(const Status& status) {
  AbortWithStatus("value() of a failed Result", status);
}

}  // namespace strider

#define STRIDER_CONCAT_INNER(a, b) a##b
#define STRIDER_CONCAT(a, b) STRIDER_CONCAT_INNER(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define STRIDER_RETURN_IF_ERROR(expr)                 \
  do {                                                \
    ::strider::Status strider_status_ = (expr);       \
    if (!strider_status_.ok()) return strider_status_; \
  } while (false)

// `lhs` = the value of the Result `expr`, or return its status.
#define STRIDER_ASSIGN_OR_RETURN(lhs, expr) \
  STRIDER_ASSIGN_OR_RETURN_IMPL(STRIDER_CONCAT(strider_result_, __LINE__), lhs, expr)
#define STRIDER_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
