// server::HelloReader: reads a ClientHello (proto/wire.h) as its bytes
// arrive, in pieces of any size, and judges each part of it as soon as it is
// in: a foreign client is refused after 4 bytes (the magic), another wire
// version after 6, a prefix claiming too much after 32. It never asks for
// more than the prefix allows (32 + kMaxSecretBytes + kMaxWorkerAddressBytes
// bytes in all), and its verdict does not depend on how the bytes were cut
// (fuzz/proto_fuzz.cc checks both).
//
// Thread contract: one thread (the acceptor's), like any value.

#ifndef REMEM_SERVER_HELLO_READER_H_
#define REMEM_SERVER_HELLO_READER_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "proto/codec.h"
#include "remem/status.h"

namespace remem::server {

class HelloReader {
 public:
  // At most this many more bytes belong to the hello (read no more).
  size_t Wanted() const;
  // Takes the next bytes (at most Wanted()). OK while the hello may still be
  // valid; ProtocolError, with the reason to tell the client, once it
  // cannot be.
  Status Feed(std::string_view bytes);
  // The whole hello is in (Wanted() is 0).
  bool done() const { return want_ != 0 && in_.size() == want_; }
  // The decoded hello, once done().
  Result<proto::ClientHelloInfo> Take() const;
  size_t received() const { return in_.size(); }

 private:
  std::string in_;
  size_t want_ = 0;  // the whole hello's size, once the prefix is in
};

}  // namespace remem::server

#endif  // REMEM_SERVER_HELLO_READER_H_
