#include "testing/server_process.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace remem::testing {

namespace {

bool Names(const std::vector<std::string>& flags, const char* flag) {
  return std::find(flags.begin(), flags.end(), flag) != flags.end();
}

}  // namespace

std::vector<std::string> ServerArgv(const ServerOptions& o,
                                    const std::string& listen) {
  std::vector<std::string> argv = o.command_prefix;
  argv.push_back(o.binary);
  if (!o.memory.empty()) argv.insert(argv.end(), {"--memory", o.memory});
  if (!o.log_level.empty()) {
    argv.insert(argv.end(), {"--log-level", o.log_level});
  }
  if (!o.pin_threads) argv.push_back("--no-pin");
  if (o.threads > 0) {
    argv.insert(argv.end(), {"--threads", std::to_string(o.threads)});
  }
  std::vector<std::string> flags = o.flags;
  if (!listen.empty()) {
    // A restart: the address it had, whatever the flags said.
    for (size_t i = 0; i + 1 < flags.size(); ++i) {
      if (flags[i] == "--listen") {
        flags.erase(flags.begin() + long(i), flags.begin() + long(i) + 2);
        break;
      }
    }
  }
  if (!Names(flags, "--listen")) {
    argv.insert(argv.end(), {"--listen", listen.empty() ? o.listen : listen});
  }
  if (!Names(flags, "--transport")) {
    argv.insert(argv.end(),
                {"--transport", std::string(TransportName(o.transport))});
  }
  argv.insert(argv.end(), flags.begin(), flags.end());
  return argv;
}

Result<std::string> AddressFromReadyLine(const std::string& line) {
  static constexpr std::string_view kMarker = "listening on ";
  const size_t at = line.find(kMarker);
  if (at == std::string::npos) {
    return Status::InvalidArgument("not a ready line: " + line);
  }
  const size_t start = at + kMarker.size();
  const size_t end = line.find_first_of(" \n", start);
  std::string address = line.substr(
      start, end == std::string::npos ? std::string::npos : end - start);
  if (address.find(':') == std::string::npos) {
    return Status::InvalidArgument("no host:port in: " + line);
  }
  return address;
}

namespace {

// Spawns the server and waits for its ready line.
Status Launch(ServerProcess* s, const std::string& listen) {
  SpawnOptions so;
  so.argv = ServerArgv(s->options, listen);
  so.env = s->options.env;
  so.cpu = s->options.cpu;
  auto p = Subprocess::Spawn(so);
  if (!p.ok()) return p.status().WithContext("starting " + s->options.binary);
  auto line = (*p)->WaitForLine("listening on", s->options.ready_timeout);
  if (!line.ok()) {
    std::string out = (*p)->output();
    return line.status().WithContext(
        "starting " + s->options.binary +
        (out.empty() ? std::string(" (nothing on its standard "
                                   "output; its standard error, "
                                   "shared with this process, "
                                   "says why)")
                     : " (it printed: " + out + ")"));
  }
  auto address = AddressFromReadyLine(*line);
  if (!address.ok()) return address.status();
  s->address = *address;
  s->ready_line = *line;
  s->process = std::move(*p);
  return Status::OK();
}

}  // namespace

Result<ServerProcess> ServerProcess::Start(ServerOptions options) {
  ServerProcess s;
  s.options = std::move(options);
  REMEM_RETURN_IF_ERROR(Launch(&s, ""));
  return s;
}

ServerProcess ServerProcess::External(std::string address) {
  ServerProcess s;
  s.address = std::move(address);
  return s;
}

ServerProcess::~ServerProcess() {
  if (process && options.stop_on_destroy && process->running()) {
    (void)Stop(std::chrono::seconds(10));  // else the process's own kill -9
  }
}

Status ServerProcess::Kill() {
  if (!process) return Status::OK();
  if (process->running()) REMEM_RETURN_IF_ERROR(process->Signal(SIGKILL));
  auto code = process->Wait(std::chrono::seconds(10));
  return code.ok() ? Status::OK() : code.status();
}

Result<int> ServerProcess::Stop(std::chrono::milliseconds timeout) {
  if (!process) return Status::NotFound("no server process");
  if (process->running()) REMEM_RETURN_IF_ERROR(process->Signal(SIGTERM));
  return process->Wait(timeout);
}

Status ServerProcess::Restart() {
  if (address.empty() || options.binary.empty()) {
    return Status::InvalidArgument("restart of a server never started here");
  }
  REMEM_RETURN_IF_ERROR(Kill());
  process.reset();
  return Launch(this, address);
}

Status ServerProcess::Pause() {
  if (!process) return Status::NotFound("no server process");
  REMEM_RETURN_IF_ERROR(process->Signal(SIGSTOP));
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    auto state = process->State();
    if (state.ok() && *state == 'T') return Status::OK();
    if (std::chrono::steady_clock::now() > until) {
      return Status::TimedOut("the server did not stop within 10 s of SIGSTOP");
    }
    std::this_thread::yield();
  }
}

Result<double> ServerProcess::CpuSeconds() const {
  if (!process) return Status::NotFound("external server");
  return process->CpuSeconds();
}

bool ServerProcess::running() const { return process && process->running(); }

}  // namespace remem::testing
