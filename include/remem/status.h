// Copyright remem authors.
//
// Status and Result<T>: the one error model of remem. Every fallible call in
// the public API and in every internal layer returns one of these; nothing
// throws across a layer boundary.
//
// Thread contract: a Status or Result is a value; distinct objects may be used
// from distinct threads freely, one object needs external synchronisation.

#ifndef REMEM_STATUS_H_
#define REMEM_STATUS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace remem {

// Stable codes: the numeric values travel in wire replies (see
// docs/PROTOCOL.md), so existing values never change meaning.
enum class StatusCode : int32_t {
  kOk = 0,
  kInvalidArgument = 1,   // the caller passed something malformed or too big
  kNotFound = 2,          // the named thing does not exist
  kPermissionDenied = 3,  // authentication failed or was not performed
  kUnavailable = 4,       // peer unreachable, connection lost, server stopped
  kTimedOut = 5,          // no answer within the deadline
  kOutOfMemory = 6,       // the store or a local allocation is full
  kCorruption = 7,        // data failed verification
  kProtocolError = 8,     // a malformed or unexpected message
  kIOError = 9,           // the operating system refused an operation
  kUnsupported = 10,      // the peer or transport cannot do this
  kAlreadyExists = 11,    // created twice
  kBusy = 12,             // try again later
  kInternal = 13,         // a bug: an invariant did not hold
  kConflict = 14,         // a compare (e.g. compare-and-put) did not match
  kOutOfRange = 15,       // arithmetic left its type's range (nothing changed)
  kMoved = 16,  // cluster: the key's shard is served elsewhere, or the
                // sender's configuration epoch is not the server's (nothing
                // changed): refresh the configuration and retry
};

// Returns a short stable name for `code`, e.g. "Unavailable".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return {StatusCode::kInvalidArgument, std::move(msg)};
  }
  static Status NotFound(std::string msg) {
    return {StatusCode::kNotFound, std::move(msg)};
  }
  static Status PermissionDenied(std::string msg) {
    return {StatusCode::kPermissionDenied, std::move(msg)};
  }
  static Status Unavailable(std::string msg) {
    return {StatusCode::kUnavailable, std::move(msg)};
  }
  static Status TimedOut(std::string msg) {
    return {StatusCode::kTimedOut, std::move(msg)};
  }
  static Status OutOfMemory(std::string msg) {
    return {StatusCode::kOutOfMemory, std::move(msg)};
  }
  static Status Corruption(std::string msg) {
    return {StatusCode::kCorruption, std::move(msg)};
  }
  static Status ProtocolError(std::string msg) {
    return {StatusCode::kProtocolError, std::move(msg)};
  }
  static Status IOError(std::string msg) {
    return {StatusCode::kIOError, std::move(msg)};
  }
  static Status Unsupported(std::string msg) {
    return {StatusCode::kUnsupported, std::move(msg)};
  }
  static Status AlreadyExists(std::string msg) {
    return {StatusCode::kAlreadyExists, std::move(msg)};
  }
  static Status Busy(std::string msg) {
    return {StatusCode::kBusy, std::move(msg)};
  }
  static Status Conflict(std::string msg) {
    return {StatusCode::kConflict, std::move(msg)};
  }
  static Status OutOfRange(std::string msg) {
    return {StatusCode::kOutOfRange, std::move(msg)};
  }
  static Status Moved(std::string msg) {
    return {StatusCode::kMoved, std::move(msg)};
  }
  static Status Internal(std::string msg) {
    return {StatusCode::kInternal, std::move(msg)};
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "OK", or "<CodeName>: <message>" ("<CodeName>" if the message is
  // empty).
  std::string ToString() const;

  // Prefixes the message with `context` ("context: message"); OK stays OK.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status)                          // NOLINT: implicit by design
      : status_(status.ok()
                    ? Status::Internal("Result constructed from an OK Status")
                    : std::move(status)) {}

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  // Precondition: ok().
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  // std::move(*Open(...)) moves, as std::optional's does (it picked the
  // const& overload, and a move-only T did not compile).
  T&& operator*() && { return std::move(*value_); }

 private:
  Status status_;  // OK exactly when value_ holds a value
  std::optional<T> value_;
};

}  // namespace remem

// Returns early from the enclosing function if `expr` is not OK.
#define REMEM_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::remem::Status remem_status_ = (expr);        \
    if (!remem_status_.ok()) return remem_status_; \
  } while (0)

#endif  // REMEM_STATUS_H_
