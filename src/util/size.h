// Byte sizes for command lines: "4096", "64K", "64KiB", "1.5G", "2GB".
// K/M/G/T are powers of 1024 (with or without "iB"/"B"). Decimal only (no
// sign, exponent, hex or blanks), a whole number of bytes ("1.5K" is 1536;
// "1.5" and "0.1K" are refused, not rounded; digits alone are exact, a
// number with a point is read as a double, to 17 significant digits),
// below 2^64; InvalidArgument saying why otherwise.
//
// Thread contract: pure functions.

#ifndef REMEM_UTIL_SIZE_H_
#define REMEM_UTIL_SIZE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "remem/status.h"

namespace remem {

Result<uint64_t> ParseSize(std::string_view text);
// 1536 -> "1.5 KiB"
std::string FormatSize(uint64_t bytes);

}  // namespace remem

#endif  // REMEM_UTIL_SIZE_H_
