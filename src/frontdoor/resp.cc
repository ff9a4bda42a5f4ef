#include "frontdoor/resp.h"

#include <algorithm>
#include <charconv>
#include <limits>

namespace remem::frontdoor {

namespace {

// The number on a "*n" or "$n" line (after its prefix); false if the line
// is not one (Redis: "invalid multibulk length").
bool ParseLength(std::string_view digits, int64_t* v) {
  if (digits.empty() || digits.size() > 20) return false;
  return ParseInt64(digits, v);
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Splits an inline line as redis-cli and Redis do: words separated by
// spaces or tabs; "double quotes" with \n \r \t \b \a \\ \" and \xHH
// escapes; 'single quotes' with \' only. False on unbalanced quotes (or a
// closing quote followed by something other than a space).
bool SplitInline(std::string_view line, std::vector<std::string>* args) {
  size_t i = 0;
  const size_t n = line.size();
  while (true) {
    while (i < n && (line[i] == ' ' || line[i] == '\t')) ++i;
    if (i == n) return true;
    std::string word;
    if (line[i] == '"') {
      ++i;
      bool closed = false;
      while (i < n) {
        char c = line[i];
        if (c == '\\' && i + 3 < n && line[i + 1] == 'x' &&
            HexValue(line[i + 2]) >= 0 && HexValue(line[i + 3]) >= 0) {
          word.push_back(
              char(HexValue(line[i + 2]) * 16 + HexValue(line[i + 3])));
          i += 4;
          continue;
        }
        if (c == '\\' && i + 1 < n) {
          char e = line[i + 1];
          switch (e) {
            case 'n':
              word.push_back('\n');
              break;
            case 'r':
              word.push_back('\r');
              break;
            case 't':
              word.push_back('\t');
              break;
            case 'b':
              word.push_back('\b');
              break;
            case 'a':
              word.push_back('\a');
              break;
            default:
              word.push_back(e);
              break;
          }
          i += 2;
          continue;
        }
        if (c == '"') {
          closed = true;
          ++i;
          break;
        }
        word.push_back(c);
        ++i;
      }
      if (!closed) return false;
      if (i < n && line[i] != ' ' && line[i] != '\t') return false;
    } else if (line[i] == '\'') {
      ++i;
      bool closed = false;
      while (i < n) {
        if (line[i] == '\\' && i + 1 < n && line[i + 1] == '\'') {
          word.push_back('\'');
          i += 2;
          continue;
        }
        if (line[i] == '\'') {
          closed = true;
          ++i;
          break;
        }
        word.push_back(line[i++]);
      }
      if (!closed) return false;
      if (i < n && line[i] != ' ' && line[i] != '\t') return false;
    } else {
      while (i < n && line[i] != ' ' && line[i] != '\t') {
        word.push_back(line[i++]);
      }
    }
    if (args->size() >= kMaxArguments) return false;
    args->push_back(std::move(word));
  }
}

Decoded Fail(std::string* error, std::string what) {
  *error = "Protocol error: " + std::move(what);
  return Decoded::kError;
}

}  // namespace

bool ParseInt64(std::string_view s, int64_t* v) {
  if (s.empty()) return false;
  const bool negative = s[0] == '-';
  std::string_view digits = negative ? s.substr(1) : s;
  if (digits.empty() || (digits.size() > 1 && digits[0] == '0')) return false;
  if (negative && digits == "0") return false;  // Redis refuses "-0"
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
  }
  int64_t out = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc() || end != s.data() + s.size()) return false;
  *v = out;
  return true;
}

Decoded DecodeRequest(std::string_view in, size_t max_bulk,
                      std::vector<std::string>* args, size_t* used,
                      std::string* error) {
  args->clear();
  *used = 0;
  if (in.empty()) return Decoded::kNeedMore;
  if (in[0] != '*') {
    const size_t nl = in.find('\n');
    if (nl == std::string_view::npos) {
      if (in.size() > kMaxInlineBytes)
        return Fail(error, "too big inline request");
      return Decoded::kNeedMore;
    }
    if (nl > kMaxInlineBytes) return Fail(error, "too big inline request");
    std::string_view line = in.substr(0, nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!SplitInline(line, args)) {
      args->clear();
      return Fail(error, "unbalanced quotes in request");
    }
    *used = nl + 1;
    return args->empty() ? Decoded::kEmpty : Decoded::kCommand;
  }
  size_t pos = 0;
  // One "<prefix><number>\r\n" line at pos.
  auto number_line = [&](int64_t* v, const char* what) -> Decoded {
    const size_t end = in.find("\r\n", pos);
    if (end == std::string_view::npos) {
      if (in.size() - pos > kMaxInlineBytes) {
        return Fail(error, std::string("too big ") + what + " count string");
      }
      return Decoded::kNeedMore;
    }
    if (!ParseLength(in.substr(pos + 1, end - pos - 1), v)) {
      return Fail(error, std::string("invalid ") + what + " length");
    }
    pos = end + 2;
    return Decoded::kCommand;
  };
  int64_t count = 0;
  if (Decoded d = number_line(&count, "multibulk"); d != Decoded::kCommand) {
    return d;
  }
  if (count > int64_t(kMaxArguments)) {
    return Fail(error, "invalid multibulk length");
  }
  if (count <= 0) {
    *used = pos;
    return Decoded::kEmpty;
  }
  // Reserve only what the bytes at hand can hold (a count of a million
  // with three bytes behind it is not worth a million strings).
  args->reserve(
      size_t(std::min<int64_t>(count, int64_t(in.size() - pos) / 4 + 1)));
  for (int64_t i = 0; i < count; ++i) {
    if (pos >= in.size()) {
      args->clear();
      return Decoded::kNeedMore;
    }
    if (in[pos] != '$') {
      args->clear();
      return Fail(error, std::string("expected '$', got '") + in[pos] + "'");
    }
    int64_t len = 0;
    if (Decoded d = number_line(&len, "bulk"); d != Decoded::kCommand) {
      args->clear();
      return d;
    }
    if (len < 0 || uint64_t(len) > max_bulk) {
      args->clear();
      return Fail(error, "invalid bulk length " + std::to_string(len) +
                             " (this server's largest is " +
                             std::to_string(max_bulk) + " bytes)");
    }
    if (in.size() - pos < size_t(len) + 2) {
      args->clear();
      return Decoded::kNeedMore;
    }
    if (in[pos + size_t(len)] != '\r' || in[pos + size_t(len) + 1] != '\n') {
      args->clear();
      return Fail(error, "bulk string not followed by CRLF");
    }
    args->emplace_back(in.substr(pos, size_t(len)));
    pos += size_t(len) + 2;
  }
  *used = pos;
  return Decoded::kCommand;
}

void AppendSimple(std::string* out, std::string_view s) {
  out->push_back('+');
  out->append(s);
  out->append("\r\n");
}

void AppendError(std::string* out, std::string_view s) {
  out->push_back('-');
  for (char c : s) out->push_back(c == '\r' || c == '\n' ? ' ' : c);
  out->append("\r\n");
}

void AppendInteger(std::string* out, int64_t v) {
  out->push_back(':');
  out->append(std::to_string(v));
  out->append("\r\n");
}

void AppendBulk(std::string* out, std::string_view s) {
  out->push_back('$');
  out->append(std::to_string(s.size()));
  out->append("\r\n");
  out->append(s);
  out->append("\r\n");
}

void AppendNil(std::string* out) { out->append("$-1\r\n"); }

void AppendArrayHeader(std::string* out, size_t n) {
  out->push_back('*');
  out->append(std::to_string(n));
  out->append("\r\n");
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  }
  return out;
}

}  // namespace remem::frontdoor
