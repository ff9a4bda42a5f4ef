#include "cluster/peer_loop.h"

#include "client/session_core.h"
#include "fabric/worker.h"
#include "util/log.h"

namespace remem::cluster {

fabric::Worker* PeerLoop::worker() const { return loop_->core()->worker(); }

void PeerLoop::Wake() { waker_.load(std::memory_order_acquire)->Wake(); }

void PeerLoop::Notify() { waker_.load(std::memory_order_acquire)->Notify(); }

Result<std::unique_ptr<PeerLoop>> PeerLoop::Create(Transport transport) {
  std::unique_ptr<PeerLoop> p(new PeerLoop(transport));
  auto loop = EventLoop::Create(transport);
  if (!loop.ok()) return loop.status();
  p->loop_ = std::move(*loop);
  p->waker_.store(p->worker(), std::memory_order_release);
  return p;
}

size_t PeerLoop::Poll() {
  size_t n = loop_->Poll();
  for (auto& l : old_) n += l->Poll();
  return n;
}

bool PeerLoop::ReplaceIfStalled() {
  if (!loop_->stalled()) return false;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_try_) return false;
  next_try_ = now + std::chrono::milliseconds(100);
  (void)loop_->Poll();  // its sessions fail now, if they had not
  auto fresh = EventLoop::Create(transport_);
  if (!fresh.ok()) {
    log::Warn("cluster: a new event loop could not be made: {}",
              fresh.status().ToString());
    return false;
  }
  log::Warn(
      "cluster: a member died while sending to this server and blocked a "
      "shared-memory receive queue; its peers are reached through a new "
      "event loop");
  old_.push_back(std::move(loop_));
  loop_ = std::move(*fresh);
  waker_.store(worker(), std::memory_order_release);
  return true;
}

}  // namespace remem::cluster
