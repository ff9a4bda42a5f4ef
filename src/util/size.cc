#include "util/size.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace remem {

Result<uint64_t> ParseSize(std::string_view text) {
  std::string s(text);
  auto bad = [&] {
    return Status::InvalidArgument("bad size '" + s +
                                   "' (examples: 4096, 64K, 512MiB, 2G)");
  };
  if (s.empty()) return bad();
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0 || !std::isfinite(v)) return bad();
  std::string unit(end);
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
    return bad();
  }
  double bytes = v * mult;
  if (bytes > 1.8e19) return bad();
  return static_cast<uint64_t>(std::llround(bytes));
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
