// Byte-level helpers for encoding fixed wire structs and for reading them
// back out of untrusted input without ever reading past its end. Every
// codec (src/proto, and each service's codec) builds on these.
//
// Thread contract: a Reader is used by one thread; the free functions are
// pure.

#ifndef REMEM_PROTO_BUFFER_H_
#define REMEM_PROTO_BUFFER_H_

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "remem/status.h"

namespace remem::proto {

// Appends the bytes of a fixed-layout struct.
template <typename T>
void Append(std::string* out, const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

inline size_t Pad8(size_t n) { return (n + 7) & ~size_t{7}; }

// A decoding failure: ProtocolError with what was wrong.
inline Status Bad(std::string what) {
  return Status::ProtocolError(std::move(what));
}

// Reads fixed structs and byte runs from untrusted input, never past the end.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  bool Read(T* out) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(out, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool ReadBytes(size_t n, std::string* out) {
    if (in_.size() - pos_ < n) return false;
    out->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  // A view of the next `n` bytes (into the input).
  bool View(size_t n, std::string_view* out) {
    if (in_.size() - pos_ < n) return false;
    *out = in_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool Skip(size_t n) {
    if (in_.size() - pos_ < n) return false;
    pos_ += n;
    return true;
  }
  size_t remaining() const { return in_.size() - pos_; }
  size_t position() const { return pos_; }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

}  // namespace remem::proto

#endif  // REMEM_PROTO_BUFFER_H_
