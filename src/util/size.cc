#include "util/size.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <system_error>

namespace remem {

Result<uint64_t> ParseSize(std::string_view text) {
  std::string s(text);
  auto bad = [&](const char* why) {
    return Status::InvalidArgument("bad size '" + s + "': " + why +
                                   " (examples: 4096, 64K, 512MiB, 1.5G)");
  };
  // Decimal digits with at most one point, then a unit: strtod alone also
  // took "0x10" (hex), "1e3", " 5" and "+5", which no size means.
  size_t i = 0, digits = 0, points = 0;
  for (; i < s.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(s[i]))) {
      ++digits;
    } else if (s[i] == '.') {
      ++points;
    } else {
      break;
    }
  }
  if (digits == 0 || points > 1) return bad("not a decimal number");
  const double v = std::strtod(s.substr(0, i).c_str(), nullptr);
  std::string unit = s.substr(i);
  for (char& c : unit) c = static_cast<char>(std::toupper(c));
  double mult = 1;
  if (unit.empty() || unit == "B") {
    mult = 1;
  } else if (unit == "K" || unit == "KB" || unit == "KIB") {
    mult = 1024.0;
  } else if (unit == "M" || unit == "MB" || unit == "MIB") {
    mult = 1024.0 * 1024;
  } else if (unit == "G" || unit == "GB" || unit == "GIB") {
    mult = 1024.0 * 1024 * 1024;
  } else if (unit == "T" || unit == "TB" || unit == "TIB") {
    mult = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return bad("unknown unit");
  }
  // Digits alone: exact, in integers (a double would round sizes past
  // 2^53).
  if (points == 0) {
    uint64_t n = 0;
    const auto r = std::from_chars(s.data(), s.data() + i, n);
    if (r.ec != std::errc() || r.ptr != s.data() + i ||
        __builtin_mul_overflow(n, uint64_t(mult), &n)) {
      return bad("too large");
    }
    return n;
  }
  // With a point, through a double (17 significant digits): a fraction of a
  // byte is a mistake, not something to round ("ns alloc z 1.5" made a
  // 2-byte segment).
  const double bytes = v * mult;
  if (bytes != std::floor(bytes)) return bad("not a whole number of bytes");
  // 2^64 and beyond do not fit (a cast of them is undefined).
  if (bytes >= 18446744073709551616.0) return bad("too large");
  return static_cast<uint64_t>(bytes);
}

std::string FormatSize(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B",
                  static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f %s", v, units[u]);
  }
  return buf;
}

}  // namespace remem
