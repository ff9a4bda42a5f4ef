// frontdoor/resp.h: Redis's protocol (RESP2) as remem's front door speaks
// it: the request decoder and the reply encoders. Pure functions over
// bytes, no I/O (frontdoor/resp_server.h serves them on a socket; the fuzz
// target fuzz/proto_fuzz.cc feeds the decoder too).
//
// A request is either a multibulk array of bulk strings ("*2\r\n$3\r\nGET
// \r\n$1\r\nk\r\n"), as every Redis client library sends, or an inline
// command (a line of words separated by spaces or tabs, "GET k\r\n"), as
// typed into telnet or redis-cli's pipe mode. The limits are Redis's own
// where Redis has one (an inline line of 64 KiB, 1,048,576 arguments) and,
// for a bulk string, the caller's (the store's largest key or value, so a
// request that can never succeed is refused before its bytes are held).
//
// Thread contract: none needed (no state).

#ifndef REMEM_FRONTDOOR_RESP_H_
#define REMEM_FRONTDOOR_RESP_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace remem::frontdoor {

inline constexpr size_t kMaxInlineBytes = 64 * 1024;
inline constexpr size_t kMaxArguments = 1024 * 1024;

enum class Decoded {
  kCommand,   // *args holds one command, *used bytes were consumed
  kEmpty,     // *used bytes held no command (an empty line, "*0"): go on
  kNeedMore,  // the buffer ends inside a request: read more
  kError,     // a protocol error (*error says which): answer and close
};

// Decodes the request at the start of `in`. `max_bulk`: the largest bulk
// string accepted. On kCommand, `args` holds the command's arguments
// (args[0] the command name, as sent).
Decoded DecodeRequest(std::string_view in, size_t max_bulk,
                      std::vector<std::string>* args, size_t* used,
                      std::string* error);

// Reply encoders: each appends one reply to *out.
void AppendSimple(std::string* out, std::string_view s);  // "+s\r\n"
// "-s\r\n": `s` starts with the error's code word (ERR, WRONGTYPE, OOM,
// ...). Line breaks in it are replaced by spaces (a reply is one line).
void AppendError(std::string* out, std::string_view s);
void AppendInteger(std::string* out, int64_t v);        // ":v\r\n"
void AppendBulk(std::string* out, std::string_view s);  // "$n\r\ns\r\n"
void AppendNil(std::string* out);                       // "$-1\r\n"
void AppendArrayHeader(std::string* out, size_t n);     // "*n\r\n"

// An ASCII-lowercased copy (command names are case-insensitive).
std::string Lower(std::string_view s);

// Redis's decimal integers (INCRBY's argument, a value INCR changes): an
// optional '-' then digits, no leading '+', spaces or zeros beyond "0",
// within int64. False if `s` is not one.
bool ParseInt64(std::string_view s, int64_t* v);

}  // namespace remem::frontdoor

#endif  // REMEM_FRONTDOOR_RESP_H_
