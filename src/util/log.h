// Logging for remem's binaries: a thin layer over spdlog so the rest of the
// code names one facility. Logs go to standard error, or to a file
// (SetFile), which ReopenFile reopens (log rotation: the server does it on
// SIGHUP).
//
// Thread contract: thread-safe; ReopenFile may run while other threads log
// (one logger for the process's life, whose sink switches files).

#ifndef REMEM_UTIL_LOG_H_
#define REMEM_UTIL_LOG_H_

#include <spdlog/spdlog.h>

#include <string>
#include <string_view>

#include "remem/status.h"

namespace remem::log {

// "trace", "debug", "info", "warn", "error", "off".
Status SetLevel(std::string_view level);
// Appends to `path` from now on (created 0600 if missing).
Status SetFile(const std::string& path);
// Closes and reopens the file SetFile named (after a rotation moved it).
Status ReopenFile();

template <typename... Args>
void Debug(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::debug(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void Info(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::info(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void Warn(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::warn(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void Error(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::error(fmt, std::forward<Args>(args)...);
}

}  // namespace remem::log

#endif  // REMEM_UTIL_LOG_H_
