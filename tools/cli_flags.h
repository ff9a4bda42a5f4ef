// Checks on parsed command lines shared by remem, remem-server and
// remem-bench (CLI11).

#ifndef REMEM_TOOLS_CLI_FLAGS_H_
#define REMEM_TOOLS_CLI_FLAGS_H_

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace remem::tools {

// The name of the first named option of `app` or of a subcommand it parsed
// that was given an empty value, other than those in `empty_allowed`; ""
// if none was. An empty value (`--auth-file "$UNSET"`, a --config line
// `data-dir =`) taken as "not given" ran without authentication or without
// durability and said nothing: the tools refuse it instead. Positional
// arguments are not looked at (an empty VALUE is a value).
inline std::string OptionGivenEmpty(
    const CLI::App& app,
    std::initializer_list<std::string_view> empty_allowed) {
  std::vector<const CLI::App*> apps = {&app};
  for (size_t i = 0; i < apps.size(); ++i) {
    for (const CLI::App* sub : apps[i]->get_subcommands()) apps.push_back(sub);
  }
  for (const CLI::App* a : apps) {
    for (const CLI::Option* o : a->get_options()) {
      if (!o->nonpositional() || o->count() == 0 || o->get_type_size() == 0 ||
          std::find(empty_allowed.begin(), empty_allowed.end(),
                    o->get_name()) != empty_allowed.end()) {
        continue;
      }
      for (const std::string& v : o->results()) {
        if (v.empty()) return o->get_name();
      }
    }
  }
  return "";
}

// A number of type T in [lo, hi], as CLI::Range checks, but saying what is
// wrong with a value: "abc" is not a number, "1.5" not a whole number for
// an integer flag (CLI::Range called both "not in range").
template <typename T>
CLI::Validator NumberIn(T lo, T hi) {
  std::ostringstream range;
  range << "[" << lo << " - " << hi << "]";
  return CLI::Validator(
      [lo, hi, r = range.str()](std::string& text) -> std::string {
        T v{};
        if (CLI::detail::lexical_cast(text, v)) {
          if constexpr (std::is_floating_point_v<T>) {
            if (std::isnan(v)) return "'" + text + "' is not a number";
          }
          if (v < lo || v > hi) return "'" + text + "' is not in " + r;
          return std::string();
        }
        double x = 0;
        if (!CLI::detail::lexical_cast(text, x) || !std::isfinite(x)) {
          return "'" + text + "' is not a number";
        }
        if (std::is_integral_v<T> && x != std::floor(x)) {
          return "'" + text + "' is not a whole number";
        }
        if (std::is_integral_v<T> && x >= double(lo) && x <= double(hi)) {
          return "'" + text + "' is not written as an integer (digits only)";
        }
        return "'" + text + "' is not in " + r;
      },
      "in " + range.str());
}

}  // namespace remem::tools

#endif  // REMEM_TOOLS_CLI_FLAGS_H_
