#include "util/log.h"

#include <fcntl.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

namespace remem::log {

namespace {

constexpr const char* kPattern = "%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v";

std::mutex g_mu;
std::string g_file;  // guarded by g_mu

void EnsureLogger() {
  static const bool init = [] {
    auto logger = spdlog::stderr_color_mt("remem");
    logger->set_pattern(kPattern);
    spdlog::set_default_logger(logger);
    return true;
  }();
  (void)init;
}

Status OpenFile(const std::string& path) {
  // Create it private before spdlog opens it: logs name peers and errors.
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Status::IOError("cannot open the log file " + path + ": " +
                           std::strerror(errno));
  }
  ::close(fd);
  try {
    auto sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path);
    auto logger = std::make_shared<spdlog::logger>("remem", sink);
    logger->set_pattern(kPattern);
    logger->set_level(spdlog::default_logger()->level());
    logger->flush_on(spdlog::level::info);
    spdlog::set_default_logger(logger);
  } catch (const spdlog::spdlog_ex& e) {
    return Status::IOError("cannot open the log file " + path + ": " +
                           e.what());
  }
  return Status::OK();
}

}  // namespace

Status SetLevel(std::string_view level) {
  EnsureLogger();
  auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") {
    return Status::InvalidArgument("unknown log level '" + std::string(level) +
                                   "' (trace, debug, info, warn, error, off)");
  }
  spdlog::set_level(lvl);
  return Status::OK();
}

Status SetFile(const std::string& path) {
  EnsureLogger();
  std::lock_guard<std::mutex> lock(g_mu);
  REMEM_RETURN_IF_ERROR(OpenFile(path));
  g_file = path;
  return Status::OK();
}

Status ReopenFile() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_file.empty()) return Status::OK();
  return OpenFile(g_file);
}

}  // namespace remem::log
