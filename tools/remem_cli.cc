// remem: the command-line client. See `remem --help` and README.md.
//
// Exit codes: 0 success; 1 the operation failed (server unreachable,
// timeout, server error, full store); 2 bad command line (or a key or value
// the server's limits refuse); 3 authentication refused; 4 key (or
// namespace, segment, object) not found; 5 compare-and-put conflict, key
// (or namespace) already exists, or an object's version not the one given;
// 6 an integer operation overflowed (incr, vector operations: the value is
// unchanged).

#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <variant>

#include "cli_flags.h"
#include "ops/vector.h"
#include "remem/cluster.h"
#include "remem/hash.h"
#include "remem/ops.h"
#include "remem/session.h"
#include "remem/space.h"
#include "remem/tree.h"
#include "remem/txn.h"
#include "remem/version.h"
#include "txn/wire.h"
#include "util/log.h"
#include "util/size.h"

namespace {

using namespace remem;

int ExitCodeFor(const Status& st) {
  if (st.code() == StatusCode::kPermissionDenied) return 3;
  if (st.code() == StatusCode::kNotFound) return 4;
  if (st.code() == StatusCode::kConflict ||
      st.code() == StatusCode::kAlreadyExists) {
    return 5;
  }
  if (st.code() == StatusCode::kInvalidArgument) return 2;
  if (st.code() == StatusCode::kOutOfRange) return 6;
  return 1;
}

// Text for the terminal: control bytes (a server's message is the
// server's to choose: escape sequences, line breaks, NUL) are shown as
// \xNN, so that what is printed is what was said, all of it.
std::string Printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto b = uint8_t(ch);
    if (b < 0x20 || b == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

int Fail(const Status& st) {
  std::fprintf(stderr, "remem: %s\n", Printable(st.ToString()).c_str());
  return ExitCodeFor(st);
}

// A JSON string literal for arbitrary bytes: bytes that are not printable
// ASCII are escaped as \u00XX (so binary values survive, byte for byte).
// The length of the UTF-8 sequence at in[i] (1-4), or 0 if none starts
// there (a stray continuation byte, an overlong form, a surrogate, past
// U+10FFFF, or cut short).
size_t Utf8SequenceAt(std::string_view in, size_t i) {
  const auto b = [&](size_t k) { return uint8_t(in[i + k]); };
  const uint8_t c = b(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t cp = 0;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > in.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (b(k) & 0x3F);
  }
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return n;
}

bool IsUtf8(std::string_view in) {
  for (size_t i = 0; i < in.size();) {
    const size_t n = Utf8SequenceAt(in, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

// A JSON string of text: UTF-8 as it is (control characters, quotes and
// backslashes escaped); a byte that is not part of valid UTF-8 as the code
// point of its value (\u00XX).
std::string JsonString(std::string_view in) {
  std::string out = "\"";
  for (size_t i = 0; i < in.size();) {
    const unsigned char ch = uint8_t(in[i]);
    const size_t n = Utf8SequenceAt(in, i);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += char(ch);
    } else if (n > 1 || (n == 1 && ch >= 0x20 && ch != 0x7f)) {
      out.append(in.data() + i, n);
      i += n;
      continue;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", ch);
      out += buf;
    }
    ++i;
  }
  return out + "\"";
}

std::string Base64(std::string_view in) {
  static constexpr char kDigits[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    if (i + 2 < in.size()) v |= uint8_t(in[i + 2]);
    out += kDigits[v >> 18 & 63];
    out += kDigits[v >> 12 & 63];
    out += i + 1 < in.size() ? kDigits[v >> 6 & 63] : '=';
    out += i + 2 < in.size() ? kDigits[v & 63] : '=';
  }
  return out;
}

// A key, value or resume key as a JSON member: `"name":"text"` when the
// bytes are valid UTF-8, else `"name_base64":"..."` (standard base64), so
// that text reads as text and any bytes come back exactly.
std::string JsonBytes(std::string_view name, std::string_view bytes) {
  if (IsUtf8(bytes)) {
    return "\"" + std::string(name) + "\":" + JsonString(bytes);
  }
  return "\"" + std::string(name) + "_base64\":\"" + Base64(bytes) + "\"";
}

// Whether `text` is a whole decimal number in T's range (an optional sign,
// '-' only for a signed T; no other base, no blanks), stored in *out. CLI11
// would clamp it, wrap "-2" around an unsigned, and read "0x10" and "010"
// as hexadecimal and octal.
template <typename T>
bool ParseDecimal(std::string_view text, T* out) {
  if (!text.empty() && text[0] == '+') {
    text.remove_prefix(1);
    if (!text.empty() && text[0] == '-') return false;  // "+-5"
  }
  const char* end = text.data() + text.size();
  auto [at, ec] = std::from_chars(text.data(), end, *out);
  return !text.empty() && ec == std::errc() && at == end;
}

// A number as text; in JSON, NaN and the infinities (which JSON has no
// numbers for) as the strings "NaN", "Infinity" and "-Infinity" (as
// protobuf's JSON mapping writes them).
// Finite numbers print as the shortest text that reads back as the same
// number: of a float element (`as_float`), the float's (a stored 0.1 prints
// as 0.1, not as the double the float widens to).
std::string NumberText(const Number& n, bool json = false,
                       bool as_float = false) {
  if (std::holds_alternative<int64_t>(n)) {
    return std::to_string(std::get<int64_t>(n));
  }
  const double d = std::get<double>(n);
  if (!std::isfinite(d)) {
    if (json) {
      return std::isnan(d) ? "\"NaN\""
             : d > 0       ? "\"Infinity\""
                           : "\"-Infinity\"";
    }
    return std::isnan(d) ? "nan" : d > 0 ? "inf" : "-inf";
  }
  char buf[64];
  const auto r = as_float ? std::to_chars(buf, buf + sizeof buf, float(d))
                          : std::to_chars(buf, buf + sizeof buf, d);
  return std::string(buf, r.ptr);
}

// A number for a vector of `type`: an integer for int64/int32, else a double.
Result<Number> ParseNumber(const std::string& text, ElemType type) {
  try {
    size_t used = 0;
    if (type == ElemType::kInt64 || type == ElemType::kInt32) {
      const long long v = std::stoll(text, &used);
      if (used == text.size()) return Number(int64_t(v));
    } else {
      // strtod, not stod: a result that underflows (a subnormal such as
      // 4.9e-324, or a float vector's 1e-50, rounded as it is stored) is a
      // number; one that overflows is not.
      char* end = nullptr;
      errno = 0;
      const double v = std::strtod(text.c_str(), &end);
      used = size_t(end - text.c_str());
      const bool overflow = errno == ERANGE && std::isinf(v);
      if (!text.empty() && used == text.size()) {
        if (!overflow) return Number(v);
        return Status::InvalidArgument(
            "'" + text + "' does not fit a " +
            (type == ElemType::kFloat ? "float" : "double"));
      }
    }
  } catch (const std::out_of_range&) {
    return Status::InvalidArgument("'" + text + "' does not fit an int64");
  } catch (const std::exception&) {
  }
  return Status::InvalidArgument("'" + text +
                                 "' is not a number for this "
                                 "vector's element type");
}

Result<ElemType> ParseElemType(const std::string& t) {
  if (t == "int64") return ElemType::kInt64;
  if (t == "double") return ElemType::kDouble;
  if (t == "float") return ElemType::kFloat;
  if (t == "int32") return ElemType::kInt32;
  return Status::InvalidArgument(
      "--type must be int64, double, float or int32");
}

// Elements (comma- or space-separated words) as a vector of `type`.
Result<VectorData> ParseElements(const std::vector<std::string>& words,
                                 ElemType type) {
  std::vector<std::string> items;
  for (const std::string& w : words) {
    size_t pos = 0;
    while (pos <= w.size()) {
      size_t comma = w.find(',', pos);
      if (comma == std::string::npos) comma = w.size();
      if (comma == pos) {
        return Status::InvalidArgument("an empty element in '" + w +
                                       "' (elements are separated by one "
                                       "comma or by spaces)");
      }
      items.push_back(w.substr(pos, comma - pos));
      pos = comma + 1;
    }
  }
  VectorData out;
  switch (type) {
    case ElemType::kInt64:
      out = std::vector<int64_t>{};
      break;
    case ElemType::kDouble:
      out = std::vector<double>{};
      break;
    case ElemType::kFloat:
      out = std::vector<float>{};
      break;
    case ElemType::kInt32:
      out = std::vector<int32_t>{};
      break;
  }
  for (const std::string& it : items) {
    auto n = ParseNumber(it, type);
    if (!n.ok()) return n.status();
    // Stored as given or refused: never wrapped or rounded to infinity.
    if (type == ElemType::kInt32 &&
        (std::get<int64_t>(*n) < std::numeric_limits<int32_t>::min() ||
         std::get<int64_t>(*n) > std::numeric_limits<int32_t>::max())) {
      return Status::InvalidArgument("'" + it + "' does not fit an int32");
    }
    if (type == ElemType::kFloat && !ops::FitsFloat(std::get<double>(*n))) {
      return Status::InvalidArgument("'" + it + "' does not fit a float");
    }
    std::visit(
        [&](auto& v) {
          using T = typename std::decay_t<decltype(v)>::value_type;
          if (std::holds_alternative<int64_t>(*n)) {
            v.push_back(T(std::get<int64_t>(*n)));
          } else {
            v.push_back(T(std::get<double>(*n)));
          }
        },
        out);
  }
  return out;
}

std::string ElementsText(const VectorData& v, bool json) {
  std::string out = json ? "[" : "";
  std::visit(
      [&](const auto& elems) {
        for (size_t i = 0; i < elems.size(); ++i) {
          if (i) out += json ? "," : " ";
          using T = typename std::decay_t<decltype(elems)>::value_type;
          if constexpr (std::is_integral_v<T>) {
            out += std::to_string(elems[i]);
          } else {
            out += NumberText(Number(double(elems[i])), json,
                              std::is_same_v<T, float>);
          }
        }
      },
      v);
  return json ? out + "]" : out;
}

// A get's answer (the hash store's or the ordered store's value).
template <typename Value>
int PrintGot(const std::string& key, const Result<Value>& r, bool show_version,
             bool json) {
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::printf("{%s,\"version\":%llu,%s}\n", JsonBytes("key", key).c_str(),
                static_cast<unsigned long long>(r->version),
                JsonBytes("value", r->value).c_str());
    return 0;
  }
  std::fwrite(r->value.data(), 1, r->value.size(), stdout);
  if (show_version) {
    std::fprintf(stderr, "version %llu\n",
                 static_cast<unsigned long long>(r->version));
  }
  return 0;
}

// A command that answers nothing but success (del, snapshot).
int PrintDone(const Status& st, bool json) {
  if (!st.ok()) return Fail(st);
  std::printf(json ? "{\"ok\":true}\n" : "OK\n");
  return 0;
}

int PrintPut(const Result<uint64_t>& r, bool json) {
  if (!r.ok()) return Fail(r.status());
  if (json) {
    std::printf("{\"version\":%llu}\n", static_cast<unsigned long long>(*r));
  } else {
    std::printf("OK version %llu\n", static_cast<unsigned long long>(*r));
  }
  return 0;
}

// A key as an error line names it: keys longer than 64 bytes (up to 64
// KiB) are cut to their first 48 bytes and their length.
std::string KeyInMessage(const std::string& key) {
  if (key.size() <= 64) return key;
  return key.substr(0, 48) + "... (" + std::to_string(key.size()) + " bytes)";
}

// A multi-get's values (HashStore's or TreeStore's), one per line or JSON.
// The exit code: a key's error other than NotFound as a single get's
// (2 for a key the limits refuse, 1 for a failure), else 4 if a key is
// absent, else 0.
template <typename Value>
int PrintMultiGet(const std::vector<std::string>& keys,
                  const std::vector<Result<Value>>& results, bool json) {
  int code = 0;
  if (json) std::printf("[");
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    if (json) {
      std::printf("%s{%s,", i ? "," : "", JsonBytes("key", keys[i]).c_str());
      if (r.ok()) {
        std::printf("\"found\":true,\"version\":%llu,%s}",
                    static_cast<unsigned long long>(r->version),
                    JsonBytes("value", r->value).c_str());
      } else {
        std::printf("\"found\":false,\"error\":%s}",
                    JsonString(r.status().ToString()).c_str());
      }
    } else if (r.ok()) {
      std::fwrite(r->value.data(), 1, r->value.size(), stdout);
      std::printf("\n");
    } else {
      std::printf("\n");
      std::fprintf(stderr, "remem: %s: %s\n", KeyInMessage(keys[i]).c_str(),
                   Printable(r.status().ToString()).c_str());
    }
    if (!r.ok()) {
      const int c = ExitCodeFor(r.status());
      if (code == 0 || code == 4) code = c;
    }
  }
  if (json) std::printf("]\n");
  return code;
}

// One server's counters: a JSON object, or name/value lines.
void PrintStats(const ServerStats& s, bool json) {
  if (json) {
    std::printf("{");
    bool first = true;
    for (const Stat& st : s.all()) {
      std::printf("%s\"%s\":", first ? "" : ",", st.name.c_str());
      if (st.is_text) {
        std::printf("%s", JsonString(st.text).c_str());
      } else {
        std::printf("%llu", static_cast<unsigned long long>(st.value));
      }
      first = false;
    }
    // One-sided reads over shared memory never reach the server's CPU, so
    // it cannot count them.
    std::printf(",\"one_sided_bytes_read\":null}");
  } else {
    for (const Stat& st : s.all()) {
      std::printf(
          "%-22s %s\n", st.name.c_str(),
          st.is_text ? st.text.c_str() : std::to_string(st.value).c_str());
    }
    std::printf("%-22s %s\n", "one_sided_bytes_read",
                "not measurable (one-sided reads bypass the server's CPU)");
  }
}

// `remem cluster info|nodes|shards|ranges`. `reach`: for nodes, whether
// each server (by address) answered a ping.
int PrintCluster(const Cluster::Info& info, const std::string& what,
                 const std::map<std::string, Status>& reach, bool json) {
  if (what == "info") {
    const uint32_t short_of_copies = info.ShortOfCopies();
    // The servers the shards are on: a member failed over (dead) or drained
    // stays listed holding nothing, and counting it said "on 4 servers" of
    // a cluster that had lost two.
    std::set<int64_t> holding;
    for (uint32_t o : info.shard_owner) holding.insert(o);
    for (uint32_t o : info.range_owner) holding.insert(o);
    for (const auto* v :
         {&info.shard_next, &info.shard_backups, &info.range_next}) {
      for (int32_t i : *v) {
        if (i >= 0) holding.insert(i);
      }
    }
    const size_t idle = info.nodes.size() - holding.size();
    if (json) {
      std::printf(
          "{\"name\":%s,\"epoch\":%u,\"shards\":%u,\"nodes\":%zu,"
          "\"holding\":%zu,\"moving\":%u,\"replicas\":%u,\"filling\":%u,"
          "\"short_of_copies\":%u,\"ranges\":%zu,\"ranges_moving\":%u}\n",
          JsonString(info.name).c_str(), info.epoch, info.num_shards,
          info.nodes.size(), holding.size(), info.moving, info.replicas,
          info.filling, short_of_copies, info.range_owner.size(),
          info.moving_ranges);
    } else {
      std::printf("cluster %s: epoch %u, %u shards on %zu server%s",
                  info.name.c_str(), info.epoch, info.num_shards,
                  holding.size(), holding.size() == 1 ? "" : "s");
      if (idle > 0) {
        std::printf(
            " (%zu more listed, holding none: failed over, drained "
            "or new)",
            idle);
      }
      if (info.replicas > 0) {
        std::printf(", %u backup%s per shard", info.replicas,
                    info.replicas == 1 ? "" : "s");
      }
      if (info.moving > 0) std::printf(", %u moving", info.moving);
      if (info.filling > 0) {
        std::printf(", %u getting a new copy", info.filling);
      }
      if (short_of_copies > 0) {
        std::printf(", %u short of copies", short_of_copies);
      }
      if (!info.range_owner.empty()) {
        std::printf("; ordered store in %zu key range%s",
                    info.range_owner.size(),
                    info.range_owner.size() == 1 ? "" : "s");
        if (info.moving_ranges > 0) {
          std::printf(", %u moving", info.moving_ranges);
        }
      }
      std::printf("\n");
    }
    return 0;
  }
  if (what == "nodes") {
    if (json) std::printf("[");
    for (size_t i = 0; i < info.nodes.size(); ++i) {
      const Cluster::Node& n = info.nodes[i];
      const auto r = reach.find(n.address);
      const Status up = r == reach.end() ? Status::OK() : r->second;
      if (json) {
        std::printf(
            "%s{\"address\":%s,\"capacity\":%llu,\"shards\":%u,"
            "\"backups\":%u,\"filling\":%u,\"domain\":%s,\"ranges\":%u,"
            "\"reachable\":%s",
            i ? "," : "", JsonString(n.address).c_str(),
            static_cast<unsigned long long>(n.capacity), n.shards, n.backups,
            n.filling, JsonString(n.domain).c_str(), n.ranges,
            up.ok() ? "true" : "false");
        if (!up.ok()) {
          std::printf(",\"error\":%s", JsonString(up.ToString()).c_str());
        }
        std::printf("}");
        continue;
      }
      std::printf("%-24s %6u shards  ", n.address.c_str(), n.shards);
      if (info.replicas > 0) std::printf("%6u backups  ", n.backups);
      std::printf("%s", FormatSize(n.capacity).c_str());
      if (!info.range_owner.empty()) {
        std::printf("  %u range%s", n.ranges, n.ranges == 1 ? "" : "s");
      }
      if (!n.domain.empty()) std::printf("  domain %s", n.domain.c_str());
      if (n.filling > 0) std::printf("  (%u being filled)", n.filling);
      if (!up.ok()) {
        std::printf("  UNREACHABLE: %s", Printable(up.ToString()).c_str());
      }
      std::printf("\n");
    }
    if (json) std::printf("]\n");
    return 0;
  }
  if (what == "shards") {
    // Runs of consecutive shards with one owner (and one destination,
    // for shards moving; the same backups, for replicated shards).
    const uint32_t f = info.replicas;
    auto same_backups = [&](uint32_t a, uint32_t b) {
      for (uint32_t i = 0; i < f; ++i) {
        if (info.shard_backups[a * f + i] != info.shard_backups[b * f + i] ||
            info.shard_filling[a * f + i] != info.shard_filling[b * f + i]) {
          return false;
        }
      }
      return f == 0 || info.shard_retiring[a] == info.shard_retiring[b];
    };
    // " backups a, b (filling)" (or " no backup left"), or ""
    // unreplicated.
    auto backups_of = [&](uint32_t s, bool as_json) {
      std::string out, filling;
      if (f == 0) return out;
      for (uint32_t i = 0; i < f; ++i) {
        const int32_t b = info.shard_backups[s * f + i];
        if (b < 0) continue;
        const std::string& a = info.nodes[size_t(b)].address;
        const bool fill = info.shard_filling[s * f + i] != 0;
        out += out.empty() ? "" : (as_json ? "," : ", ");
        out += as_json ? JsonString(a) : a + (fill ? " (filling)" : "");
        if (fill) filling += (filling.empty() ? "" : ",") + JsonString(a);
      }
      const int32_t r = info.shard_retiring[s];
      const std::string retiring =
          r < 0 ? std::string() : info.nodes[size_t(r)].address;
      if (as_json) {
        return ",\"backups\":[" + out + "],\"filling\":[" + filling +
               "],\"retiring\":" +
               (retiring.empty() ? std::string("null") : JsonString(retiring));
      }
      if (!retiring.empty()) {
        out += (out.empty() ? "" : ", ") + retiring + " (retiring)";
      }
      return out.empty() ? std::string("  (no backup left)")
                         : "  backups " + out;
    };
    if (json) std::printf("[");
    bool first = true;
    for (uint32_t s = 0; s < info.shard_owner.size();) {
      uint32_t e = s;
      while (e + 1 < info.shard_owner.size() &&
             info.shard_owner[e + 1] == info.shard_owner[s] &&
             info.shard_next[e + 1] == info.shard_next[s] &&
             same_backups(e + 1, s)) {
        ++e;
      }
      const std::string& owner = info.nodes[info.shard_owner[s]].address;
      const int32_t next = info.shard_next[s];
      if (json) {
        std::printf("%s{\"first\":%u,\"last\":%u,\"owner\":%s",
                    first ? "" : ",", s, e, JsonString(owner).c_str());
        if (next >= 0) {
          std::printf(",\"moving_to\":%s",
                      JsonString(info.nodes[size_t(next)].address).c_str());
        }
        std::printf("%s}", backups_of(s, true).c_str());
      } else if (next >= 0) {
        std::printf("%5u-%-5u %s -> %s\n", s, e, owner.c_str(),
                    info.nodes[size_t(next)].address.c_str());
      } else {
        std::printf("%5u-%-5u %s%s\n", s, e, owner.c_str(),
                    backups_of(s, false).c_str());
      }
      first = false;
      s = e + 1;
    }
    if (json) std::printf("]\n");
    return 0;
  }
  if (what == "ranges") {
    // The ordered store's ranges: [from, to) and the owner of each.
    if (info.range_owner.empty()) {
      if (json) {
        std::printf("[]\n");
      } else {
        std::printf(
            "no ordered store (the cluster was formed without "
            "--tree-splits)\n");
      }
      return 0;
    }
    if (json) std::printf("[");
    for (size_t r = 0; r < info.range_owner.size(); ++r) {
      const std::string from = r == 0 ? std::string() : info.splits[r - 1];
      const std::string to =
          r < info.splits.size() ? info.splits[r] : std::string();
      const std::string& owner = info.nodes[info.range_owner[r]].address;
      const int32_t next = r < info.range_next.size() ? info.range_next[r] : -1;
      const std::string moving_to =
          next < 0 ? std::string() : info.nodes[size_t(next)].address;
      // Replicated: the shard it rides, whose backups are its own.
      std::string copies, copies_json;
      if (r < info.range_carrier.size()) {
        const uint32_t s = info.range_carrier[r];
        copies = "  (rides shard " + std::to_string(s) + "; backups:";
        copies_json = ",\"carrier\":" + std::to_string(s) + ",\"backups\":[";
        bool any = false;
        for (uint32_t i = 0; i < info.replicas; ++i) {
          const size_t at = size_t(s) * info.replicas + i;
          if (at >= info.shard_backups.size() || info.shard_backups[at] < 0) {
            continue;
          }
          const std::string& b =
              info.nodes[size_t(info.shard_backups[at])].address;
          const bool filling =
              at < info.shard_filling.size() && info.shard_filling[at] != 0;
          copies += " " + b + (filling ? " (filling)" : "");
          copies_json += std::string(any ? "," : "") + JsonString(b);
          any = true;
        }
        copies += any ? ")" : " none left)";
        copies_json += "]";
      }
      if (json) {
        std::printf("%s{\"range\":%zu,%s,%s,\"owner\":%s,\"moving_to\":%s%s}",
                    r ? "," : "", r, JsonBytes("from", from).c_str(),
                    r < info.splits.size() ? JsonBytes("to", to).c_str()
                                           : "\"to\":null",
                    JsonString(owner).c_str(),
                    next < 0 ? "null" : JsonString(moving_to).c_str(),
                    copies_json.c_str());
      } else {
        std::printf("%5zu [%s, %s)  %s%s%s%s\n", r,
                    r == 0 ? "-inf" : JsonString(from).c_str(),
                    r < info.splits.size() ? JsonString(to).c_str() : "+inf",
                    owner.c_str(), next < 0 ? "" : " -> ", moving_to.c_str(),
                    copies.c_str());
      }
    }
    if (json) std::printf("]\n");
    return 0;
  }
  return Fail(Status::InvalidArgument(
      "cluster wants info, nodes, shards, ranges or drain NODE; got '" + what +
      "'"));
}

// `remem obj ...`: transactional objects (remem/txn.h) on one server, one
// object per command (mread: several, read together), each in a
// transaction of its own. `what` is the subcommand's name.
struct ObjArgs {
  std::string what;
  std::string id;
  std::vector<std::string> ids;  // mread
  std::string value;
  uint32_t capacity = 0;
  std::optional<uint64_t> if_version;  // write, free
};

int RunObj(Session* session, const ObjArgs& a, bool json) {
  auto store = ObjectStore::Open(session);
  if (!store.ok()) return Fail(store.status());
  if (a.what == "alloc") {
    ObjectId made;
    Status st = (*store)->Run([&](Transaction& tx) -> Status {
      auto id = tx.Alloc(a.value, a.capacity);
      if (!id.ok()) return id.status();
      made = *id;
      return Status::OK();
    });
    if (!st.ok()) return Fail(st);
    if (json) {
      std::printf("{\"id\":%s,\"capacity\":%u}\n",
                  JsonString(made.ToString()).c_str(), made.capacity);
    } else {
      std::printf("%s\n", made.ToString().c_str());
    }
    return 0;
  }
  if (a.what == "mread") {
    // One read-only transaction: the objects as they all were at one
    // moment (run again if a commit changed one of them meanwhile).
    std::vector<ObjectId> ids;
    for (const std::string& text : a.ids) {
      auto id = ObjectId::Parse(text);
      if (!id.ok()) return Fail(id.status());
      ids.push_back(*id);
    }
    std::vector<std::string> values;
    std::vector<uint64_t> versions;
    Status st = (*store)->Run([&](Transaction& tx) -> Status {
      auto got = tx.ReadMany(ids, &versions);
      if (!got.ok()) return got.status();
      values = std::move(*got);
      return Status::OK();
    });
    if (!st.ok()) return Fail(st);
    if (json) std::printf("[");
    for (size_t i = 0; i < values.size(); ++i) {
      if (json) {
        std::printf("%s{%s,\"version\":%llu,%s}", i ? "," : "",
                    JsonBytes("id", a.ids[i]).c_str(),
                    static_cast<unsigned long long>(versions[i]),
                    JsonBytes("value", values[i]).c_str());
      } else {
        std::fwrite(values[i].data(), 1, values[i].size(), stdout);
        std::printf("\n");
      }
    }
    if (json) std::printf("]\n");
    return 0;
  }
  auto id = ObjectId::Parse(a.id);
  if (!id.ok()) return Fail(id.status());
  if (a.what == "read") {
    auto got = (*store)->Read(*id);
    if (!got.ok()) return Fail(got.status());
    if (json) {
      std::printf("{%s,\"version\":%llu,%s}\n", JsonBytes("id", a.id).c_str(),
                  static_cast<unsigned long long>(got->version),
                  JsonBytes("value", got->data).c_str());
    } else {
      std::fwrite(got->data.data(), 1, got->data.size(), stdout);
    }
    return 0;
  }
  // write, free: with --if-version, only if the object is at that version
  // (Conflict, exit 5, if not); else whatever it holds.
  uint64_t version = 0;
  auto tx = (*store)->Begin();
  if (a.if_version) {
    // The version read is the one the commit checks.
    uint64_t now = 0;
    auto read = tx->Read(*id, &now);
    if (!read.ok()) return Fail(read.status());
    if (now != *a.if_version) {
      return Fail(Status::Conflict("object " + a.id + " is at version " +
                                   std::to_string(now) + ", not " +
                                   std::to_string(*a.if_version)));
    }
  }
  Status st = a.what == "write" ? tx->Write(*id, a.value) : tx->Free(*id);
  if (st.ok()) st = tx->Commit();
  if (!st.ok()) return Fail(st);
  if (a.what == "write") {
    auto v = tx->committed_versions().find(*id);
    if (v != tx->committed_versions().end()) version = v->second;
    if (json) {
      std::printf("{\"version\":%llu}\n",
                  static_cast<unsigned long long>(version));
    } else {
      std::printf("OK version %llu\n",
                  static_cast<unsigned long long>(version));
    }
    return 0;
  }
  return PrintDone(Status::OK(), json);
}

// `remem ns ...`: namespaces of raw remote memory (remem/space.h) on one
// server. `what` is the subcommand's name.
struct NsArgs {
  std::string what;
  std::string name;
  uint64_t size = 0;  // reserve, release (UINT64_MAX: all), alloc
  uint64_t address = 0;
  uint64_t offset = 0;  // write
  uint64_t length = 0;  // read
};

int RunNs(Session* session, const NsArgs& a, bool json) {
  if (a.what == "list") {
    auto list = Namespace::List(session);
    if (!list.ok()) return Fail(list.status());
    if (json) {
      std::printf("[");
      for (size_t i = 0; i < list->size(); ++i) {
        const NamespaceInfo& n = (*list)[i];
        std::printf(
            "%s{\"name\":%s,\"id\":%llu,\"reserved\":%llu,\"allocated\":%llu,"
            "\"segments\":%u}",
            i ? "," : "", JsonString(n.name).c_str(),
            static_cast<unsigned long long>(n.id),
            static_cast<unsigned long long>(n.reserved_bytes),
            static_cast<unsigned long long>(n.allocated_bytes), n.segments);
      }
      std::printf("]\n");
      return 0;
    }
    std::printf("%-24s %8s %14s %14s %8s\n", "NAME", "ID", "RESERVED",
                "ALLOCATED", "SEGMENTS");
    for (const NamespaceInfo& n : *list) {
      std::printf("%-24s %8llu %14llu %14llu %8u\n", n.name.c_str(),
                  static_cast<unsigned long long>(n.id),
                  static_cast<unsigned long long>(n.reserved_bytes),
                  static_cast<unsigned long long>(n.allocated_bytes),
                  n.segments);
    }
    return 0;
  }
  if (a.what == "create") {
    auto ns = Namespace::Create(session, a.name);
    if (!ns.ok()) return Fail(ns.status());
    if (json) {
      std::printf("{\"name\":%s,\"id\":%llu}\n", JsonString(a.name).c_str(),
                  static_cast<unsigned long long>((*ns)->id()));
    } else {
      std::printf("OK id %llu\n", static_cast<unsigned long long>((*ns)->id()));
    }
    return 0;
  }
  if (a.what == "delete") {
    return PrintDone(Namespace::Delete(session, a.name), json);
  }
  auto opened = Namespace::Open(session, a.name);
  if (!opened.ok()) return Fail(opened.status());
  Namespace& ns = **opened;
  if (a.what == "info") {
    auto info = ns.Info();
    if (!info.ok()) return Fail(info.status());
    if (json) {
      std::printf(
          "{\"name\":%s,\"id\":%llu,\"reserved\":%llu,\"allocated\":%llu,"
          "\"segments\":%u,\"chunk\":%u}\n",
          JsonString(ns.name()).c_str(),
          static_cast<unsigned long long>(ns.id()),
          static_cast<unsigned long long>(info->reserved_bytes),
          static_cast<unsigned long long>(info->allocated_bytes),
          info->segments, info->chunk_bytes);
      return 0;
    }
    std::printf("namespace %s: id %llu\n", ns.name().c_str(),
                static_cast<unsigned long long>(ns.id()));
    std::printf("reserved   %llu (%s)\n",
                static_cast<unsigned long long>(info->reserved_bytes),
                FormatSize(info->reserved_bytes).c_str());
    std::printf("allocated  %llu (%s)\n",
                static_cast<unsigned long long>(info->allocated_bytes),
                FormatSize(info->allocated_bytes).c_str());
    std::printf("segments   %u\n", info->segments);
    std::printf("chunk      %u (%s)\n", info->chunk_bytes,
                FormatSize(info->chunk_bytes).c_str());
    return 0;
  }
  if (a.what == "reserve") return PrintDone(ns.Reserve(a.size), json);
  if (a.what == "release") return PrintDone(ns.Release(a.size), json);
  if (a.what == "alloc") {
    auto seg = ns.Alloc(a.size);
    if (!seg.ok()) return Fail(seg.status());
    if (json) {
      std::printf("{\"address\":%llu,\"length\":%llu}\n",
                  static_cast<unsigned long long>(seg->address),
                  static_cast<unsigned long long>(seg->length));
    } else {
      std::printf("%llu\n", static_cast<unsigned long long>(seg->address));
    }
    return 0;
  }
  if (a.what == "free") return PrintDone(ns.Free(a.address), json);
  if (a.what == "segments") {
    auto segs = ns.Segments();
    if (!segs.ok()) return Fail(segs.status());
    if (json) std::printf("[");
    for (size_t i = 0; i < segs->size(); ++i) {
      const Segment& s = (*segs)[i];
      std::printf(
          json ? "%s{\"address\":%llu,\"length\":%llu}" : "%s%llu %llu\n",
          json && i ? "," : "", static_cast<unsigned long long>(s.address),
          static_cast<unsigned long long>(s.length));
    }
    if (json) std::printf("]\n");
    return 0;
  }
  if (a.what == "write") {
    if (a.offset > UINT64_MAX - a.address) {
      return Fail(Status::InvalidArgument("ADDRESS + --offset is past 2^64"));
    }
    const uint64_t at = a.address + a.offset;
    // The bytes from `at` to the end of its segment: standard input may
    // not be longer (read up to one byte past, so an endless input is
    // refused, not held in memory).
    auto segs = ns.Segments();
    if (!segs.ok()) return Fail(segs.status());
    uint64_t room = 0;
    bool held = false;
    for (const Segment& s : *segs) {
      if (at >= s.address && at - s.address < s.length) {
        room = s.length - (at - s.address);
        held = true;
      }
    }
    if (!held) {
      // The server's own answer (NotFound: no segment holds it).
      auto m = ns.Map(at, 1);
      if (!m.ok()) return Fail(m.status());
      return Fail(
          Status::NotFound("no segment holds address " + std::to_string(at)));
    }
    std::string data;
    char buf[1 << 16];
    size_t got;
    while (data.size() <= room &&
           (got = std::fread(buf, 1, sizeof(buf), stdin)) > 0) {
      data.append(buf, got);
    }
    if (std::ferror(stdin)) {
      return Fail(Status::IOError("reading standard input: " +
                                  std::string(std::strerror(errno))));
    }
    if (data.size() > room) {
      return Fail(Status::InvalidArgument(
          "standard input is longer than the " + std::to_string(room) +
          " bytes from address " + std::to_string(at) +
          " to the end of its segment"));
    }
    if (data.empty()) return PrintDone(Status::OK(), json);
    auto m = ns.Map(at, data.size());
    if (!m.ok()) return Fail(m.status());
    Status st = (*m)->Write(0, data.data(), data.size());
    m->reset();
    return PrintDone(st, json);
  }
  if (a.what == "read") {
    if (a.length == 0) {
      return Fail(Status::InvalidArgument("LENGTH must be at least 1 byte"));
    }
    auto m = ns.Map(a.address, a.length);
    if (!m.ok()) return Fail(m.status());
    // A piece at a time, so a large read is not held in memory (--json:
    // whole, as one value).
    constexpr uint64_t kPiece = uint64_t{1} << 20;
    std::string all;
    std::string piece;
    for (uint64_t off = 0; off < a.length; off += kPiece) {
      const size_t n = size_t(std::min(kPiece, a.length - off));
      piece.resize(n);
      Status st = (*m)->Read(off, piece.data(), n);
      if (!st.ok()) return Fail(st);
      if (json) {
        all += piece;
      } else {
        std::fwrite(piece.data(), 1, n, stdout);
      }
    }
    if (json) {
      std::printf("{\"address\":%llu,\"length\":%llu,%s}\n",
                  static_cast<unsigned long long>(a.address),
                  static_cast<unsigned long long>(a.length),
                  JsonBytes("data", all).c_str());
    }
    return 0;
  }
  return 2;
}

// The command; main adds the check of what it wrote.
int RunCli(int argc, char** argv) {
  // Line-buffered even into a pipe: scripts read progress as it happens.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"remem: command-line client for remem-server"};
  // The global flags (--json, --server, --timeout, ...) also after the
  // subcommand: `remem stats --json` as `remem --json stats`. Inherited by
  // every subcommand added below.
  app.fallthrough();
  app.set_version_flag("--version", std::string("remem ") + kVersion +
                                        " (wire version " +
                                        std::to_string(kWireVersion) + ")");
  app.require_subcommand(1);
  SessionOptions opts;
  std::string transport = "auto";
  std::string auth_file;
  double timeout_s = 10;
  bool json = false;
  auto* server_opt =
      app.add_option("-s,--server", opts.server, "server address host:port")
          ->capture_default_str()
          ->envname("REMEM_SERVER");
  app.add_option("--transport", transport,
                 "auto | shm | tcp (see remem-server --help)")
      ->capture_default_str();
  app.add_option("--auth-file", auth_file,
                 "file holding the server's shared secret")
      ->envname("REMEM_AUTH_FILE");
  app.add_option("--timeout", timeout_s, "seconds to wait for the server")
      ->capture_default_str()
      ->check(
          [](const std::string& text) -> std::string {
            try {
              size_t used = 0;
              const double v = std::stod(text, &used);
              if (used == text.size() && v > 0 && v <= 86400 * 365) return "";
            } catch (const std::exception&) {
            }
            return "must be a number of seconds more than 0 (at "
                   "most a year), not '" +
                   text + "'";
          },
          "SECONDS");
  app.add_flag("--json", json, "print machine-readable JSON");
  std::string cluster_seeds;
  auto* cluster_opt =
      app.add_option("--cluster", cluster_seeds,
                     "talk to a cluster through these servers (host:port,...) "
                     "instead of --server: keys are routed to their owners")
          ->envname("REMEM_CLUSTER");
  std::string read_from = "primary";
  app.add_option("--read-from", read_from,
                 "primary | any: with --cluster, which copy of a replicated "
                 "shard a get reads: its primary (linearizable), or any "
                 "whole copy in turn, backups too (a weaker mode: README, "
                 "\"Clusters\")")
      ->capture_default_str()
      ->check(CLI::IsMember({"primary", "any"}));

  auto* ping = app.add_subcommand(
      "ping", "round-trip time to the server and the transport in use");
  int count = 1;
  ping->add_option("-c,--count", count, "number of pings")
      ->capture_default_str()
      ->check(tools::NumberIn(1, 1000000));
  auto* stats = app.add_subcommand("stats", "server counters");
  auto* snapshot = app.add_subcommand(
      "snapshot",
      "snapshot every durable data model to the server's --data-dir now "
      "(returns once it is on disk)");
  std::string read_path = "auto";
  app.add_option("--read-path", read_path,
                 "onesided | rpc | auto: how gets and scans read (the hash "
                 "store and the ordered store)")
      ->capture_default_str();
  std::string key, value;
  auto* get = app.add_subcommand(
      "get", "print KEY's value (raw bytes) to standard output");
  get->add_option("key", key, "key")->required();
  bool show_version = false;
  get->add_flag("--version-to-stderr", show_version,
                "also print the value's version on standard error");
  auto* put = app.add_subcommand(
      "put", "set KEY to VALUE ('-' reads the value from standard input)");
  put->add_option("key", key, "key")->required();
  put->add_option("value", value, "value, or - for standard input")->required();
  bool if_absent = false;
  std::optional<uint64_t> if_version;
  auto* put_absent =
      put->add_flag("--if-absent", if_absent, "only insert; exit 5 if present");
  // A version is a decimal uint64 (ParseDecimal): CLI11's own conversion
  // took -1 as 2^64-1 and clamped a number past the range.
  auto parse_version = [](const std::string& text) {
    uint64_t v = 0;
    if (!ParseDecimal(text, &v)) {
      throw CLI::ValidationError("--if-version",
                                 "'" + text +
                                     "' is not a version (a number from 0 "
                                     "to 18446744073709551615)");
    }
    return v;
  };
  auto version_option = [&if_version, parse_version](CLI::App* cmd,
                                                     CLI::Option* absent) {
    cmd->add_option_function<std::string>(
           "--if-version",
           [&if_version, parse_version](const std::string& text) {
             if_version = parse_version(text);
           },
           "only replace this version (a version put printed); exit 5 if "
           "it changed, 4 if KEY is absent")
        ->excludes(absent);
  };
  version_option(put, put_absent);
  std::vector<std::string> mkeys;
  auto* mget = app.add_subcommand(
      "mget",
      "print the values of KEY... one per line, in one batch (exit 4 if any "
      "is absent; --json for binary-safe output)");
  mget->add_option("keys", mkeys, "keys")->required();
  auto* del = app.add_subcommand("del", "delete KEY (exit 4 if absent)");
  del->add_option("key", key, "key")->required();

  // Server-side operations (remem/ops.h).
  int64_t incr_by = 1;
  auto* incr = app.add_subcommand(
      "incr",
      "add N (default 1) to KEY's 8-byte integer on the server, creating it "
      "at 0 (Redis INCRBY); prints the new value. Exit 6 on overflow (the "
      "value is unchanged), 2 if KEY holds something else");
  incr->add_option("key", key, "key")->required();
  // A decimal int64, refused (exit 2) past its range (ParseDecimal).
  incr->add_option_function<std::string>(
      "n",
      [&incr_by](const std::string& text) {
        int64_t v = 0;
        if (!ParseDecimal(text, &v)) {
          throw CLI::ValidationError(
              "n", "'" + text +
                       "' is not an amount (a decimal integer from "
                       "-9223372036854775808 to 9223372036854775807)");
        }
        incr_by = v;
      },
      "amount (may be negative: after --)");
  auto* vec = app.add_subcommand(
      "vec", "typed vectors stored under a key, operated on by the server");
  vec->require_subcommand(1);
  std::string elem_type = "int64", vfn, vnum;
  std::vector<std::string> elems;
  bool indices = false;
  auto* vput = vec->add_subcommand("put", "store KEY as a vector of ELEMS");
  vput->add_option("key", key, "key")->required();
  vput->add_option("elems", elems, "elements (space or comma separated)");
  vput->add_option("--type", elem_type, "int64 | double | float | int32")
      ->capture_default_str();
  auto* vget = vec->add_subcommand("get", "print KEY's elements");
  vget->add_option("key", key, "key")->required();
  auto* vupdate = vec->add_subcommand(
      "update",
      "element = FN(element, OPERAND) for every element, on the server; FN "
      "is add | mul | set | min | max; OPERAND a number or a comma-separated "
      "vector of the same length");
  vupdate->add_option("key", key, "key")->required();
  vupdate->add_option("fn", vfn, "add | mul | set | min | max")->required();
  vupdate->add_option("operand", vnum, "number or a,b,c")->required();
  auto* vreduce = vec->add_subcommand(
      "reduce",
      "print sum | min | max | count of KEY's elements (on the server, or "
      "read one-sided and reduced here: --read-path), or the result of the "
      "user reduction with that id (a remem-server --ops-library; always "
      "on the server)");
  vreduce->add_option("key", key, "key")->required();
  vreduce->add_option("fn", vfn, "sum | min | max | count | ID")->required();
  auto* vfilter = vec->add_subcommand(
      "filter",
      "print the elements e of KEY with `e OP NUMBER`, on the server");
  vfilter->add_option("key", key, "key")->required();
  vfilter->add_option("op", vfn, "lt | le | gt | ge | eq | ne")->required();
  vfilter->add_option("number", vnum, "number")->required();
  vfilter->add_flag("--indices", indices, "print their positions instead");
  std::string cluster_what = "info";
  auto* cluster_cmd = app.add_subcommand(
      "cluster",
      "with --cluster: the configuration (info), its servers and whether "
      "each answers (nodes), "
      "which server owns which shards (shards) and which ordered key ranges "
      "(ranges), or move every shard away from a server (drain NODE)");
  cluster_cmd
      ->add_option("what", cluster_what,
                   "info | nodes | shards | ranges | drain")
      ->capture_default_str();
  std::string drain_node;
  cluster_cmd->add_option(
      "node", drain_node,
      "drain: the server (host:port) whose shards move to the others; "
      "waits up to --timeout for it to own none");

  // The ordered store (remem/tree.h).
  auto* treecmd = app.add_subcommand(
      "tree", "the ordered store: point operations and range scans");
  treecmd->require_subcommand(1);
  auto* tput = treecmd->add_subcommand(
      "put", "set KEY to VALUE ('-' reads the value from standard input)");
  tput->add_option("key", key, "key")->required();
  tput->add_option("value", value, "value, or - for standard input")
      ->required();
  auto* tput_absent = tput->add_flag("--if-absent", if_absent,
                                     "only insert; exit 5 if present");
  version_option(tput, tput_absent);
  auto* tget = treecmd->add_subcommand(
      "get", "print KEY's value (raw bytes; exit 4 if absent)");
  tget->add_option("key", key, "key")->required();
  tget->add_flag("--version-to-stderr", show_version,
                 "also print the value's version on standard error");
  auto* tmget = treecmd->add_subcommand(
      "mget",
      "print the values of KEY... one per line, in one batch (exit 4 if any "
      "is absent; --json for binary-safe output)");
  tmget->add_option("keys", mkeys, "keys")->required();
  auto* tdel = treecmd->add_subcommand("del", "delete KEY (exit 4 if absent)");
  tdel->add_option("key", key, "key")->required();
  std::string scan_start, scan_end, scan_prefix;
  uint32_t scan_limit = 100;
  bool scan_desc = false, scan_all = false;
  auto* tscan = treecmd->add_subcommand(
      "scan",
      "print the pairs with START <= key < END in key order, one "
      "'key<TAB>value' per line (--json: binary-safe, with the resume key)");
  tscan->add_option("start", scan_start, "first key (default: the lowest)");
  tscan->add_option("end", scan_end, "end, exclusive (default: no bound)");
  auto* prefix_opt = tscan->add_option(
      "--prefix", scan_prefix,
      "only keys that begin with this (instead of a range; '' is every key)");
  tscan->add_option("--limit", scan_limit, "pairs per page")
      ->capture_default_str()
      ->check(tools::NumberIn(1u, 10000u));
  tscan->add_flag("--desc", scan_desc, "highest key first");
  tscan->add_flag("--all", scan_all,
                  "every page, not only the first (ignores the resume key)");
  std::string scan_after;
  auto* after_opt = tscan->add_option(
      "--after", scan_after,
      "start after this key (exclusive; a lone key given is then END): to "
      "continue an ascending scan, give the last key it printed");

  // Namespaces of raw remote memory (remem/space.h), on one server.
  NsArgs ns_args;
  auto* nscmd = app.add_subcommand(
      "ns",
      "namespaces of raw remote memory on one server (--server): segments "
      "allocated, written and read by address");
  nscmd->require_subcommand(1);
  // SIZE and LENGTH as the server's sizes (4096, 64K, 1.5M: util/size.h);
  // ADDRESS a decimal uint64 (ParseDecimal), as alloc prints it.
  auto size_arg = [](CLI::App* cmd, const std::string& name, uint64_t* out,
                     const std::string& help, bool all_ok = false) {
    return cmd
        ->add_option_function<std::string>(
            name,
            [name, out, all_ok](const std::string& text) {
              if (all_ok && text == "all") {
                *out = UINT64_MAX;
                return;
              }
              auto n = ParseSize(text);
              if (!n.ok()) {
                throw CLI::ValidationError(name, n.status().message());
              }
              *out = *n;
            },
            help)
        ->required();
  };
  auto address_arg = [](CLI::App* cmd, uint64_t* out) {
    return cmd
        ->add_option_function<std::string>(
            "address",
            [out](const std::string& text) {
              if (!ParseDecimal(text, out)) {
                throw CLI::ValidationError(
                    "address", "'" + text +
                                   "' is not an address (a decimal number "
                                   "from 0 to 18446744073709551615, as "
                                   "'ns alloc' prints)");
              }
            },
            "address in the namespace (decimal)")
        ->required();
  };
  auto ns_name = [&ns_args](CLI::App* cmd) {
    cmd->add_option("name", ns_args.name, "namespace")->required();
  };
  nscmd->add_subcommand(
      "list",
      "every namespace: name, id, reserved and allocated bytes, segments");
  ns_name(nscmd->add_subcommand("create",
                                "create namespace NAME (exit 5 if it exists)"));
  ns_name(nscmd->add_subcommand(
      "delete", "delete NAME: its segments are freed (exit 4 if absent)"));
  ns_name(nscmd->add_subcommand(
      "info", "NAME's reserved and allocated bytes, segments, chunk size"));
  auto* ns_reserve = nscmd->add_subcommand(
      "reserve", "set SIZE bytes (rounded up to chunks) aside for NAME");
  ns_name(ns_reserve);
  size_arg(ns_reserve, "size", &ns_args.size, "bytes (64M, 4096, ...)");
  auto* ns_release = nscmd->add_subcommand(
      "release", "give up to SIZE bytes (or all) of NAME's reservation back");
  ns_name(ns_release);
  size_arg(ns_release, "size", &ns_args.size, "bytes, or all", true);
  auto* ns_alloc = nscmd->add_subcommand(
      "alloc", "allocate a zeroed segment of SIZE bytes; print its address");
  ns_name(ns_alloc);
  size_arg(ns_alloc, "size", &ns_args.size, "bytes (64M, 4096, ...)");
  auto* ns_free =
      nscmd->add_subcommand("free", "free the segment that starts at ADDRESS");
  ns_name(ns_free);
  address_arg(ns_free, &ns_args.address);
  ns_name(nscmd->add_subcommand(
      "segments", "NAME's segments: address and length, one per line"));
  auto* ns_write = nscmd->add_subcommand(
      "write",
      "write standard input (raw bytes) at ADDRESS + --offset, inside one "
      "segment");
  ns_name(ns_write);
  address_arg(ns_write, &ns_args.address);
  ns_write->add_option_function<std::string>(
      "--offset",
      [&ns_args](const std::string& text) {
        auto n = ParseSize(text);
        if (!n.ok())
          throw CLI::ValidationError("--offset", n.status().message());
        ns_args.offset = *n;
      },
      "bytes past ADDRESS (default 0)");
  auto* ns_read = nscmd->add_subcommand(
      "read",
      "print LENGTH bytes at ADDRESS (raw bytes; --json: binary-safe), inside "
      "one segment");
  ns_name(ns_read);
  address_arg(ns_read, &ns_args.address);
  size_arg(ns_read, "length", &ns_args.length, "bytes");

  // Transactional objects (remem/txn.h), on one server.
  ObjArgs obj_args;
  auto* objcmd = app.add_subcommand(
      "obj",
      "transactional objects on one server (--server): one object per "
      "command (mread: several), each in a transaction of its own");
  objcmd->require_subcommand(1);
  auto* obj_alloc = objcmd->add_subcommand(
      "alloc", "make an object holding VALUE; print its id");
  obj_alloc->add_option("value", obj_args.value, "its bytes ('-': stdin)")
      ->required();
  obj_alloc->add_option("--capacity", obj_args.capacity,
                        "room for this many bytes (default: VALUE's size)");
  auto obj_id = [&obj_args](CLI::App* cmd) {
    cmd->add_option("id", obj_args.id,
                    "object id, ADDRESS:INCARNATION:CAPACITY as alloc "
                    "prints it")
        ->required();
  };
  obj_id(objcmd->add_subcommand(
      "read", "print the object's bytes (--json: with its version)"));
  objcmd
      ->add_subcommand("mread",
                       "print the bytes of ID... one per line, read together "
                       "in one transaction: one state of them all (--json: "
                       "binary-safe, with versions)")
      ->add_option("ids", obj_args.ids,
                   "object ids, ADDRESS:INCARNATION:CAPACITY as alloc "
                   "prints them")
      ->required();
  auto* obj_write = objcmd->add_subcommand(
      "write", "set the object's bytes to VALUE (at most its capacity)");
  obj_id(obj_write);
  obj_write->add_option("value", obj_args.value, "its bytes ('-': stdin)")
      ->required();
  auto* obj_free =
      objcmd->add_subcommand("free", "free the object (its id reads none)");
  obj_id(obj_free);
  for (CLI::App* cmd : {obj_write, obj_free}) {
    cmd->add_option_function<std::string>(
        "--if-version",
        [&obj_args, parse_version](const std::string& text) {
          obj_args.if_version = parse_version(text);
        },
        "only if the object is at this version (exit 5 if not)");
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A misspelt command leaves a word CLI11 only calls "extra".
    if (app.get_subcommands().empty() && !app.remaining().empty() &&
        app.remaining().front().rfind("-", 0) != 0) {
      std::fprintf(stderr,
                   "remem: unknown command '%s'\nRun with --help for the "
                   "commands.\n",
                   app.remaining().front().c_str());
      return 2;
    }
    // The same inside a group of commands (`remem tree bogus`: CLI11 says
    // only that a subcommand is required).
    // (What the group does not take falls through to the top.)
    for (CLI::App* group : {vec, treecmd, nscmd, objcmd}) {
      if (!group->parsed() || !group->get_subcommands().empty()) continue;
      std::vector<std::string> rest = group->remaining();
      if (rest.empty()) rest = app.remaining();
      if (!rest.empty() && rest.front().rfind("-", 0) != 0) {
        std::fprintf(stderr,
                     "remem: unknown %s command '%s'\nRun 'remem %s --help' "
                     "for its commands.\n",
                     group->get_name().c_str(), rest.front().c_str(),
                     group->get_name().c_str());
        return 2;
      }
    }
    // A key or value that starts with '-' is taken for an option, and CLI11
    // then says only that the value is required.
    if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      std::vector<std::string> rest = app.remaining();
      for (CLI::App* sub : app.get_subcommands()) {
        for (const std::string& r : sub->remaining()) rest.push_back(r);
      }
      std::string command;  // the words of the command given
      for (const CLI::App* sub = &app; !sub->get_subcommands().empty();) {
        sub = sub->get_subcommands().front();
        command += " " + sub->get_name();
      }
      for (const std::string& r : rest) {
        if (r.size() < 2 || r[0] != '-') continue;
        std::fprintf(stderr,
                     "remem: %s\n'%s' is not an option here: a key or value "
                     "that starts with '-' goes after -- (remem%s ... -- "
                     "%s)\n",
                     e.what(), r.c_str(), command.c_str(), r.c_str());
        return 2;
      }
    }
    const int code = app.exit(e);  // prints help or the error
    return code == 0 ? 0 : 2;      // every usage error exits 2
  }
  // An option given an empty value (`--auth-file "$UNSET"`) is refused:
  // taken as not given, it connected without the secret and the server's
  // refusal blamed the secret. (An empty --prefix or --after means "from
  // the first key"; an empty positional VALUE is a value.)
  if (std::string empty = tools::OptionGivenEmpty(app, {"--prefix", "--after"});
      !empty.empty()) {
    std::fprintf(stderr, "remem: %s was given an empty value\n", empty.c_str());
    return 2;
  }
  (void)log::SetLevel("warn");
  // `put KEY -` and `tree put KEY -`: the value is standard input.
  // Read up to one byte past the largest value any store takes (16 MiB),
  // so an endless or huge input is refused at once, not held in memory.
  if ((obj_alloc->parsed() || obj_write->parsed()) && obj_args.value == "-") {
    obj_args.value.clear();
    char buf[1 << 16];
    size_t got;
    while (obj_args.value.size() <= txn::kMaxObjectBytes &&
           (got = std::fread(buf, 1, sizeof(buf), stdin)) > 0) {
      obj_args.value.append(buf, got);
    }
    if (std::ferror(stdin)) {
      return Fail(Status::IOError("reading the value from standard input: " +
                                  std::string(std::strerror(errno))));
    }
  }
  if ((put->parsed() || tput->parsed()) && value == "-") {
    constexpr size_t kMaxValueBytes = size_t{16} << 20;
    value.clear();
    char buf[1 << 16];
    size_t got;
    while (value.size() <= kMaxValueBytes &&
           (got = std::fread(buf, 1, sizeof(buf), stdin)) > 0) {
      value.append(buf, got);
    }
    if (std::ferror(stdin)) {
      return Fail(Status::IOError("reading the value from standard input: " +
                                  std::string(std::strerror(errno))));
    }
    if (value.size() > kMaxValueBytes) {
      return Fail(Status::InvalidArgument("values are at most " +
                                          std::to_string(kMaxValueBytes) +
                                          " bytes (standard input is longer)"));
    }
  }

  auto t = ParseTransport(transport);
  if (!t.ok()) return Fail(t.status());
  opts.transport = *t;
  auto rp = ParseReadPath(read_path);
  if (!rp.ok()) return Fail(rp.status());
  opts.read_path = *rp;
  opts.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  if (!auth_file.empty()) {
    auto secret = ReadSecretFile(auth_file);
    if (!secret.ok()) {
      Fail(secret.status());
      return 2;  // a bad command line, as for remem-server
    }
    opts.secret = *secret;
    struct stat st;  // as remem-server warns
    if (::stat(auth_file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      std::fprintf(stderr,
                   "remem: warning: the auth file %s can be read or written "
                   "by other users (mode %04o): chmod 600 it\n",
                   auth_file.c_str(), unsigned(st.st_mode & 07777));
    }
  }
  // The tree command on a server's TreeStore or a cluster's ClusterTree
  // (the same calls).
  auto run_tree = [&](auto& tree) -> int {
    if (tmget->parsed()) {
      std::vector<std::string_view> views(mkeys.begin(), mkeys.end());
      return PrintMultiGet(mkeys, tree.MultiGet(views), json);
    }
    if (tget->parsed()) return PrintGot(key, tree.Get(key), show_version, json);
    if (tput->parsed()) {
      Result<uint64_t> r = if_absent ? tree.PutIfAbsent(key, value)
                           : if_version
                               ? tree.CompareAndPut(key, value, *if_version)
                               : tree.Put(key, value);
      return PrintPut(r, json);
    }
    if (tdel->parsed()) return PrintDone(tree.Delete(key), json);
    const auto order = scan_desc ? TreeStore::Order::kDescending
                                 : TreeStore::Order::kAscending;
    std::string start = scan_start, end = scan_end;
    // An empty --prefix is a prefix as any other (every key has it): its
    // lone key with --desc is END, and a range beside it is refused.
    const bool prefix_given = prefix_opt->count() > 0;
    if (prefix_given) {
      // Descending, a lone key given is the END: a descending prefix scan
      // continues with the last key it printed, as any descending scan.
      const bool lone_end = scan_desc && after_opt->count() == 0 &&
                            !scan_start.empty() && scan_end.empty();
      if ((!scan_start.empty() && !lone_end) || !scan_end.empty()) {
        return Fail(Status::InvalidArgument(
            "give either --prefix or a range, not both (with --prefix and "
            "--desc, one key is END)"));
      }
      // The range of keys with the prefix (as TreeStore::ScanPrefix).
      start = scan_prefix;
      std::string e = scan_prefix;
      while (!e.empty() && uint8_t(e.back()) == 0xff) e.pop_back();
      if (!e.empty()) e.back() = char(uint8_t(e.back()) + 1);
      end = e;
      if (lone_end) {
        if (end.empty() || scan_start < end) end = scan_start;
        if (end < start) end = start;  // below the prefix: nothing left
      }
    }
    if (after_opt->count() > 0) {
      // The ordered store's keys are at most 64 KiB (remem/tree.h; not a
      // server flag): a longer --after key is no key (the bound made of it
      // was refused as "scan bounds are at most 65537 bytes").
      constexpr size_t kTreeMaxKey = 64 << 10;
      if (scan_after.size() > kTreeMaxKey) {
        return Fail(Status::InvalidArgument(
            "--after: a key of " + std::to_string(scan_after.size()) +
            " bytes; the ordered store's keys are at most " +
            std::to_string(kTreeMaxKey)));
      }
      if (scan_desc) {
        return Fail(Status::InvalidArgument(
            "--after continues an ascending scan; a descending one "
            "continues with its last key as END"));
      }
      // With --after, a lone positional key is the END.
      if (!scan_start.empty() && !scan_end.empty()) {
        return Fail(Status::InvalidArgument(
            "give either START or --after (with --after, one key is END)"));
      }
      if (!scan_start.empty()) {
        if (prefix_given) {
          return Fail(Status::InvalidArgument(
              "give either --prefix or a range, not both"));
        }
        end = scan_start;
        start.clear();
      }
      // The keys after it: from it and a zero byte (the least longer key).
      std::string from = scan_after;
      from.push_back('\0');
      if (from > start) start = std::move(from);
      if (!end.empty() && start > end) {
        // (A scan's last key printed is always below its END.)
        return Fail(Status::InvalidArgument(
            "the --after key is not below the scan's end (END, or the keys "
            "with the prefix): nothing could follow it"));
      }
    }
    // JSON goes out a page at a time once the page is whole, so a failed
    // first page prints nothing on standard output; with --all, a page
    // that fails after others were printed ends the object with an
    // "error" member (valid JSON, and the exit code says it failed).
    std::string json_items;
    bool json_open = false;
    size_t n = 0;
    bool more = false;
    std::string resume;
    // A single page asks for one pair more than it prints, so that its
    // "more" says whether a pair follows (a page the limit ended said more
    // even when none did); --all's pages need not know.
    const bool probe = !scan_all && scan_limit < tree.max_scan();
    for (;;) {
      auto page = tree.Scan(start, end, scan_limit + (probe ? 1 : 0), order);
      if (page.ok() && probe && page->items.size() > scan_limit) {
        page->items.pop_back();
        page->more = true;
        // Where the library's page of scan_limit pairs would resume.
        page->resume = page->items.back().key;
        if (!scan_desc) page->resume.push_back('\0');
      }
      if (!page.ok()) {
        if (json_open) {
          std::printf("],\"count\":%zu,%s}\n", n,
                      JsonBytes("error", page.status().ToString()).c_str());
        }
        return Fail(page.status());
      }
      for (const TreeStore::Item& it : page->items) {
        if (json) {
          if (n > 0) json_items += ',';
          json_items += "{" + JsonBytes("key", it.key) +
                        ",\"version\":" + std::to_string(it.version) + "," +
                        JsonBytes("value", it.value) + "}";
        } else {
          std::fwrite(it.key.data(), 1, it.key.size(), stdout);
          std::printf("\t");
          std::fwrite(it.value.data(), 1, it.value.size(), stdout);
          std::printf("\n");
        }
        ++n;
      }
      more = page->more;
      resume = page->resume;
      if (json) {
        std::printf("%s%s", json_open ? "" : "{\"items\":[",
                    json_items.c_str());
        json_items.clear();
        json_open = true;
      }
      if (!scan_all || !more) break;
      (scan_desc ? end : start) = page->resume;
    }
    if (json) {
      std::printf("],\"count\":%zu,\"more\":%s,%s}\n", n,
                  more ? "true" : "false", JsonBytes("resume", resume).c_str());
    } else if (more) {
      // Standard output holds only pairs; say on standard error that they
      // are not all (or, for a page that 1 MiB of pairs ended, may not
      // be).
      // The END argument of a descending scan is the second positional
      // one (a lone one is START), but with --prefix the first.
      std::fprintf(stderr,
                   "remem: the page ended at %zu pair%s; more may follow: "
                   "--all for every page, or %s for the next\n",
                   n, n == 1 ? "" : "s",
                   !scan_desc ? "--after with the last key printed"
                   : prefix_given
                       ? "the last key printed as END (--prefix P --desc END)"
                       : "the last key printed as END (tree scan --desc START "
                         "END, with START \"\" for none)");
    }
    return 0;
  };
  // --server and --cluster name different targets: both on the command
  // line (or both only in the environment) leave unknown which was meant.
  // One on the command line wins over the other's environment variable.
  bool server_wins = false;
  if (server_opt->count() > 0 && cluster_opt->count() > 0) {
    auto on_command_line = [&](std::initializer_list<std::string_view> names) {
      for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a == "--") break;
        for (std::string_view n : names) {
          // --name, --name=VALUE, -s, -sVALUE.
          const bool is_short = n.size() == 2;
          if (a == n || (a.starts_with(n) && a.size() > n.size() &&
                         (is_short || a[n.size()] == '='))) {
            return true;
          }
        }
      }
      return false;
    };
    const bool server_arg = on_command_line({"-s", "--server"});
    const bool cluster_arg = on_command_line({"--cluster"});
    if (server_arg == cluster_arg) {
      return Fail(Status::InvalidArgument(
          server_arg ? "--server and --cluster: give one server or a "
                       "cluster's seeds, not both"
                     : "REMEM_SERVER and REMEM_CLUSTER are both set: unset "
                       "one, or give --server or --cluster"));
    }
    server_wins = server_arg;  // REMEM_CLUSTER stands aside
    if (server_wins) cluster_seeds.clear();
  }
  if (!server_wins && cluster_opt->count() > 0 && cluster_seeds.empty()) {
    return Fail(Status::InvalidArgument(
        "--cluster needs seed servers (host:port,...)"));
  }
  if (cluster_seeds.empty() && read_from != "primary") {
    return Fail(Status::InvalidArgument(
        "--read-from any reads a cluster's backups: it needs --cluster"));
  }
  if (!cluster_seeds.empty() && nscmd->parsed()) {
    return Fail(
        Status::InvalidArgument("namespaces live on one server: use --server"));
  }
  if (!cluster_seeds.empty() && objcmd->parsed()) {
    return Fail(Status::InvalidArgument(
        "transactional objects live on one server: use --server"));
  }
  // The cluster command's own arguments, before anything is contacted: a
  // bad one was reported only once the cluster answered (and as
  // "Unavailable", exit 1, when none was up).
  if (cluster_cmd->parsed()) {
    static const std::set<std::string> kWhat = {"info", "nodes", "shards",
                                                "ranges", "drain"};
    if (kWhat.count(cluster_what) == 0) {
      return Fail(Status::InvalidArgument(
          "cluster wants info, nodes, shards, ranges or drain NODE; got '" +
          cluster_what + "'"));
    }
    if (cluster_what == "drain" && drain_node.empty()) {
      return Fail(Status::InvalidArgument(
          "cluster drain needs the server to drain (host:port)"));
    }
    if (cluster_what != "drain" && !drain_node.empty()) {
      return Fail(Status::InvalidArgument("cluster " + cluster_what +
                                          " takes no server"));
    }
  }
  if (!cluster_seeds.empty()) {
    auto seeds = ParseSeeds(cluster_seeds);
    if (!seeds.ok()) return Fail(seeds.status());
    ClusterOptions co;
    co.seeds = std::move(*seeds);
    co.session = opts;
    co.read_from =
        read_from == "any" ? ReadFrom::kAnyReplica : ReadFrom::kPrimary;
    // A cluster still forming answers within --timeout.
    co.wait_for_config = opts.timeout;
    auto cl = Cluster::Connect(co);
    if (!cl.ok()) return Fail(cl.status());
    Cluster& cluster = **cl;
    if (cluster_cmd->parsed() && cluster_what == "drain") {
      Status st = cluster.Drain(drain_node, opts.timeout);
      if (st.code() == StatusCode::kNotFound) {
        // Not a member: the command named the wrong server (not a key).
        (void)Fail(st);
        return 2;
      }
      if (!st.ok()) return Fail(st);
      if (json) {
        std::printf("{\"drained\":%s}\n", JsonString(drain_node).c_str());
        return 0;
      }
      std::printf("%s drained: it %s no shard%s\n", drain_node.c_str(),
                  cluster.info().replicas > 0 ? "owns or backs up" : "owns",
                  cluster.info().range_owner.empty() ? "" : " and no range");
      return 0;
    }
    if (cluster_cmd->parsed()) {
      // The newest configuration any member gives (Cluster::Refresh): the
      // seed may be a server cut off from ZooKeeper, whose own is stale.
      (void)cluster.Refresh();
      std::map<std::string, Status> reach;
      if (cluster_what == "nodes") {
        for (auto& [addr, st] : cluster.ForEachServer(
                 [](Session* s) { return s->Ping().status(); })) {
          reach[addr] = st;
        }
      }
      return PrintCluster(cluster.info(), cluster_what, reach, json);
    }
    if (get->parsed()) {
      return PrintGot(key, cluster.Get(key), show_version, json);
    }
    if (put->parsed()) {
      return PrintPut(if_absent ? cluster.PutIfAbsent(key, value)
                      : if_version
                          ? cluster.CompareAndPut(key, value, *if_version)
                          : cluster.Put(key, value),
                      json);
    }
    if (mget->parsed()) {
      std::vector<std::string_view> views(mkeys.begin(), mkeys.end());
      return PrintMultiGet(mkeys, cluster.MultiGet(views), json);
    }
    if (del->parsed()) return PrintDone(cluster.Delete(key), json);
    if (stats->parsed()) {
      // Every server's counters, each under its address.
      int code = 0;
      if (json) std::printf("{");
      bool first = true;
      for (auto& [addr, s] : cluster.Stats()) {
        if (!s.ok()) {
          std::fprintf(stderr, "remem: %s: %s\n", addr.c_str(),
                       Printable(s.status().ToString()).c_str());
          code = ExitCodeFor(s.status());
          if (json) {
            // As the Python module's stats(): {"error": why} for a server
            // that could not be asked, so every server has its entry.
            std::printf("%s%s:{\"error\":%s}", first ? "" : ",",
                        JsonString(addr).c_str(),
                        JsonString(s.status().ToString()).c_str());
            first = false;
          }
          continue;
        }
        if (json) {
          std::printf("%s%s:", first ? "" : ",", JsonString(addr).c_str());
        } else {
          std::printf("%s# %s\n", first ? "" : "\n", addr.c_str());
        }
        PrintStats(*s, json);
        first = false;
      }
      if (json) std::printf("}\n");
      return code;
    }
    if (incr->parsed()) {
      auto r = cluster.Execute(Op::AddFetch(key, incr_by, /*create=*/true));
      if (!r.ok()) return Fail(r.status());
      auto v = r->Int();
      if (!v.ok()) return Fail(v.status());
      if (json) {
        std::printf("{\"value\":%lld,\"version\":%llu}\n",
                    static_cast<long long>(*v),
                    static_cast<unsigned long long>(r->version));
      } else {
        std::printf("%lld\n", static_cast<long long>(*v));
      }
      return 0;
    }
    if (ping->parsed() || snapshot->parsed()) {
      // Every server of the cluster, each on its own line (--json: one
      // object, each server's outcome under its address).
      int code = 0;
      bool first = true;
      if (json) std::printf("{");
      // A ping: `count` round trips to each server, as to a single one.
      struct Rtt {
        std::string transport;
        double min = 1e300, max = 0, sum = 0;
      };
      std::vector<Rtt> rtts;  // per server answered, in turn
      size_t next_rtt = 0;
      for (auto& [addr, st] : cluster.ForEachServer([&](Session* s) {
             if (snapshot->parsed()) return s->TakeSnapshot();
             Rtt r{s->transport()};
             for (int i = 0; i < count; ++i) {
               auto p = s->Ping();
               if (!p.ok()) return p.status();
               r.min = std::min(r.min, p->rtt_us);
               r.max = std::max(r.max, p->rtt_us);
               r.sum += p->rtt_us;
             }
             rtts.push_back(std::move(r));
             return Status::OK();
           })) {
        if (!st.ok()) code = ExitCodeFor(st);
        const Rtt* rtt = st.ok() && ping->parsed() && next_rtt < rtts.size()
                             ? &rtts[next_rtt++]
                             : nullptr;
        if (json) {
          std::printf("%s%s:", first ? "" : ",", JsonString(addr).c_str());
          if (st.ok() && rtt != nullptr) {
            std::printf(
                "{\"ok\":true,\"transport\":%s,\"count\":%d,"
                "\"rtt_us\":{\"min\":%.3f,\"avg\":%.3f,\"max\":%.3f}}",
                JsonString(rtt->transport).c_str(), count, rtt->min,
                rtt->sum / count, rtt->max);
          } else if (st.ok()) {
            std::printf("{\"ok\":true}");
          } else {
            std::printf("{\"ok\":false,\"error\":%s}",
                        JsonString(st.ToString()).c_str());
          }
        } else if (!st.ok()) {
          std::fprintf(stderr, "remem: %s: %s\n", addr.c_str(),
                       Printable(st.ToString()).c_str());
        } else if (rtt != nullptr) {
          std::printf(
              "%s OK: transport %s, rtt min/avg/max = %.2f/%.2f/%.2f "
              "us over %d ping%s\n",
              addr.c_str(), rtt->transport.c_str(), rtt->min, rtt->sum / count,
              rtt->max, count, count == 1 ? "" : "s");
        } else {
          std::printf("%s OK\n", addr.c_str());
        }
        first = false;
      }
      if (json) std::printf("}\n");
      return code;
    }
    if (treecmd->parsed()) {
      auto ct = cluster.Tree();
      if (!ct.ok()) return Fail(ct.status());
      return run_tree(**ct);
    }
    // A vector command is several operations on one key (a read of the
    // element type, then the op): all of them go to the key's owner, as to
    // a single server.
    opts.server = cluster.OwnerOf(key);
  }
  if (cluster_cmd->parsed()) {
    return Fail(Status::InvalidArgument(
        "remem cluster needs --cluster SEEDS (host:port,...)"));
  }
  auto session = Session::Connect(opts);
  if (!session.ok()) return Fail(session.status());
  Session& c = **session;
  std::unique_ptr<HashStore> hash;
  if (get->parsed() || put->parsed() || mget->parsed() || del->parsed()) {
    auto h = HashStore::Open(&c);
    if (!h.ok()) return Fail(h.status());
    hash = std::move(*h);
  }

  if (incr->parsed() || vec->parsed()) {
    OpsOptions oo;
    oo.reduce_path = *rp;
    auto o = OpsStore::Open(&c, oo);
    if (!o.ok()) return Fail(o.status());
    OpsStore& ops = **o;
    if (incr->parsed()) {
      auto r = ops.AddFetch(key, incr_by, /*create=*/true);
      if (!r.ok()) return Fail(r.status());
      if (json) {
        std::printf("{\"value\":%lld,\"version\":%llu}\n",
                    static_cast<long long>(r->value),
                    static_cast<unsigned long long>(r->version));
      } else {
        std::printf("%lld\n", static_cast<long long>(r->value));
      }
      return 0;
    }
    if (vput->parsed()) {
      auto type = ParseElemType(elem_type);
      if (!type.ok()) return Fail(type.status());
      auto v = ParseElements(elems, *type);
      if (!v.ok()) return Fail(v.status());
      auto r = ops.VecPut(key, *v);
      return PrintPut(r, json);
    }
    // The other commands need the stored vector's element type (to encode
    // numbers): one read, one-sided where possible.
    auto cur = ops.VecGet(key);
    if (!cur.ok()) return Fail(cur.status());
    const ElemType type = TypeOf(cur->data);
    if (vget->parsed()) {
      if (json) {
        std::printf("{\"type\":\"%s\",\"version\":%llu,\"elements\":%s}\n",
                    ops::ElemTypeName(type),
                    static_cast<unsigned long long>(cur->version),
                    ElementsText(cur->data, true).c_str());
      } else {
        std::printf("%s\n", ElementsText(cur->data, false).c_str());
      }
      return 0;
    }
    if (vupdate->parsed()) {
      static const std::map<std::string, VecFn> kFns = {{"add", VecFn::kAdd},
                                                        {"mul", VecFn::kMul},
                                                        {"set", VecFn::kSet},
                                                        {"min", VecFn::kMin},
                                                        {"max", VecFn::kMax}};
      auto f = kFns.find(vfn);
      if (f == kFns.end()) {
        return Fail(
            Status::InvalidArgument("FN must be add, mul, set, min or max"));
      }
      Op op;
      if (vnum.find(',') != std::string::npos) {
        auto v = ParseElements({vnum}, type);
        if (!v.ok()) return Fail(v.status());
        op = Op::VecUpdate(key, f->second, *v);
      } else {
        auto n = ParseNumber(vnum, type);
        if (!n.ok()) return Fail(n.status());
        op = Op::VecUpdate(key, f->second, *n);
      }
      auto r = ops.Execute(op);
      if (!r.ok()) return Fail(r.status());
      return PrintPut(r->version, json);
    }
    if (vreduce->parsed()) {
      static const std::map<std::string, Reduction> kReds = {
          {"sum", Reduction::kSum},
          {"min", Reduction::kMin},
          {"max", Reduction::kMax},
          {"count", Reduction::kCount}};
      auto f = kReds.find(vfn);
      uint32_t id = 0;
      if (f == kReds.end()) {
        // A user reduction's id: decimal, 1 .. 2^32-1.
        char* end = nullptr;
        errno = 0;
        const unsigned long long n = std::strtoull(vfn.c_str(), &end, 10);
        if (vfn.empty() || !std::isdigit(static_cast<unsigned char>(vfn[0])) ||
            *end != '\0' || errno != 0 || n == 0 || n > UINT32_MAX) {
          return Fail(Status::InvalidArgument(
              "FN must be sum, min, max, count or the id (1 to 4294967295) "
              "of a reduction the server's --ops-library registered"));
        }
        id = uint32_t(n);
      }
      auto r = id != 0 ? ops.VecReduce(key, id) : ops.VecReduce(key, f->second);
      if (!r.ok()) return Fail(r.status());
      if (json) {
        std::printf("{\"%s\":%s}\n", vfn.c_str(), NumberText(*r, true).c_str());
      } else {
        std::printf("%s\n", NumberText(*r).c_str());
      }
      return 0;
    }
    static const std::map<std::string, Predicate> kPreds = {
        {"lt", Predicate::kLt}, {"le", Predicate::kLe}, {"gt", Predicate::kGt},
        {"ge", Predicate::kGe}, {"eq", Predicate::kEq}, {"ne", Predicate::kNe}};
    auto p = kPreds.find(vfn);
    if (p == kPreds.end()) {
      return Fail(
          Status::InvalidArgument("OP must be lt, le, gt, ge, eq or ne"));
    }
    auto n = ParseNumber(vnum, type);
    if (!n.ok()) return Fail(n.status());
    auto r = ops.VecFilter(key, p->second, *n, indices);
    if (!r.ok()) return Fail(r.status());
    if (json) {
      std::printf("{\"%s\":%s}\n", indices ? "indices" : "elements",
                  ElementsText(*r, true).c_str());
    } else {
      std::printf("%s\n", ElementsText(*r, false).c_str());
    }
    return 0;
  }

  if (nscmd->parsed()) {
    ns_args.what = nscmd->get_subcommands().front()->get_name();
    return RunNs(&c, ns_args, json);
  }
  if (objcmd->parsed()) {
    obj_args.what = objcmd->get_subcommands().front()->get_name();
    return RunObj(&c, obj_args, json);
  }

  if (treecmd->parsed()) {
    auto ts = TreeStore::Open(&c);
    if (!ts.ok()) return Fail(ts.status());
    return run_tree(**ts);
  }

  if (ping->parsed()) {
    double min = 1e300, max = 0, sum = 0;
    for (int i = 0; i < count; ++i) {
      auto r = c.Ping();
      if (!r.ok()) return Fail(r.status());
      min = std::min(min, r->rtt_us);
      max = std::max(max, r->rtt_us);
      sum += r->rtt_us;
    }
    if (json) {
      std::printf(
          "{\"server\":\"%s\",\"transport\":\"%s\",\"count\":%d,"
          "\"rtt_us\":{\"min\":%.3f,\"avg\":%.3f,\"max\":%.3f},"
          "\"one_sided_reads\":\"%s\"}\n",
          opts.server.c_str(), c.transport().c_str(), count, min, sum / count,
          max, c.reads_are_local() ? "local-mapping" : "remote-get");
    } else {
      std::printf("pong from %s: transport %s, one-sided reads %s\n",
                  opts.server.c_str(), c.transport().c_str(),
                  c.reads_are_local()
                      ? "map the server's memory (shared memory)"
                      : "are remote gets");
      std::printf("rtt min/avg/max = %.2f/%.2f/%.2f us over %d ping%s\n", min,
                  sum / count, max, count, count == 1 ? "" : "s");
    }
    return 0;
  }
  if (get->parsed()) return PrintGot(key, hash->Get(key), show_version, json);
  if (put->parsed()) {
    return PrintPut(if_absent    ? hash->PutIfAbsent(key, value)
                    : if_version ? hash->CompareAndPut(key, value, *if_version)
                                 : hash->Put(key, value),
                    json);
  }
  if (mget->parsed()) {
    std::vector<std::string_view> views(mkeys.begin(), mkeys.end());
    return PrintMultiGet(mkeys, hash->MultiGet(views), json);
  }
  if (del->parsed()) return PrintDone(hash->Delete(key), json);
  if (snapshot->parsed()) return PrintDone(c.TakeSnapshot(), json);
  if (stats->parsed()) {
    auto s = c.Stats();
    if (!s.ok()) return Fail(s.status());
    PrintStats(*s, json);
    if (json) std::printf("\n");
    return 0;
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const int rc = RunCli(argc, argv);
  // Output that could not be written (a full disk, a closed standard
  // output) fails the command: `remem get k > file` must not leave a
  // truncated file behind an exit status of 0.
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (!flushed || std::ferror(stdout)) {
    std::fprintf(stderr, "remem: could not write standard output%s%s\n",
                 flushed ? "" : ": ", flushed ? "" : std::strerror(err));
    return rc == 0 ? 1 : rc;
  }
  return rc;
}
