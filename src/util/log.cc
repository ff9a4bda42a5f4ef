#include "util/log.h"

#include <fcntl.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>

namespace remem::log {

namespace {

constexpr const char* kPattern = "%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v";

// The one logger's one sink: it forwards to stderr or to the log file, and
// switches between them under its lock. The logger itself is never
// replaced: other threads use the default logger through a raw pointer
// (spdlog::info and friends), so replacing it on SIGHUP freed it under them.
class SwitchSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit SwitchSink(std::shared_ptr<spdlog::sinks::sink> target)
      : target_(std::move(target)) {}
  void Switch(std::shared_ptr<spdlog::sinks::sink> target) {
    std::lock_guard<std::mutex> lock(mutex_);
    target_ = std::move(target);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    target_->log(msg);
  }
  void flush_() override { target_->flush(); }

 private:
  std::shared_ptr<spdlog::sinks::sink> target_;  // guarded by mutex_
};

std::mutex g_mu;
std::string g_file;  // guarded by g_mu

SwitchSink* Sink() {
  static SwitchSink* const sink = [] {
    auto err = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    err->set_pattern(kPattern);
    auto sink = std::make_shared<SwitchSink>(err);
    auto logger = std::make_shared<spdlog::logger>("remem", sink);
    logger->flush_on(spdlog::level::info);
    spdlog::set_default_logger(logger);
    return sink.get();  // owned by the logger, which lives to the end
  }();
  return sink;
}

void EnsureLogger() { (void)Sink(); }

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
    auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path);
    file->set_pattern(kPattern);
    Sink()->Switch(std::move(file));
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
