#include "remem/status.h"

namespace remem {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "InvalidArgument";
    case StatusCode::kNotFound:
      return "NotFound";
    case StatusCode::kPermissionDenied:
      return "PermissionDenied";
    case StatusCode::kUnavailable:
      return "Unavailable";
    case StatusCode::kTimedOut:
      return "TimedOut";
    case StatusCode::kOutOfMemory:
      return "OutOfMemory";
    case StatusCode::kCorruption:
      return "Corruption";
    case StatusCode::kProtocolError:
      return "ProtocolError";
    case StatusCode::kIOError:
      return "IOError";
    case StatusCode::kUnsupported:
      return "Unsupported";
    case StatusCode::kAlreadyExists:
      return "AlreadyExists";
    case StatusCode::kBusy:
      return "Busy";
    case StatusCode::kInternal:
      return "Internal";
    case StatusCode::kConflict:
      return "Conflict";
    case StatusCode::kOutOfRange:
      return "OutOfRange";
    case StatusCode::kMoved:
      return "Moved";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code_));
  if (!message_.empty()) {
    out += ": ";
    out += message_;
  }
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return Status(code_, std::move(msg));
}

}  // namespace remem
