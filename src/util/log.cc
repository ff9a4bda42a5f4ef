#include "util/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace remem::log {

Status SetLevel(std::string_view level) {
  static const bool init = [] {
    auto logger = spdlog::stderr_color_mt("remem");
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
    spdlog::set_default_logger(logger);
    return true;
  }();
  (void)init;
  auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") {
    return Status::InvalidArgument("unknown log level '" + std::string(level) +
                                   "' (trace, debug, info, warn, error, off)");
  }
  spdlog::set_level(lvl);
  return Status::OK();
}

}  // namespace remem::log
