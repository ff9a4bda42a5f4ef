#include "testing/hash_store_kv.h"

#include <optional>
#include <utility>
#include <vector>

#include "remem/hash.h"
#include "remem/session.h"

namespace remem::testing {

namespace {

class HashStoreClient : public KvClient {
 public:
  HashStoreClient(std::unique_ptr<Session> session,
                  std::unique_ptr<HashStore> store)
      : session_(std::move(session)), store_(std::move(store)) {}
  ~HashStoreClient() override { store_.reset(); }  // before its session

  Result<KvValue> Get(std::string_view key) override {
    auto v = store_->Get(key);
    if (!v.ok()) return v.status();
    return KvValue{std::move(v->value), v->version};
  }
  Result<uint64_t> Put(std::string_view key, std::string_view value) override {
    return store_->Put(key, value);
  }
  Result<uint64_t> PutIfAbsent(std::string_view key,
                               std::string_view value) override {
    return store_->PutIfAbsent(key, value);
  }
  Result<uint64_t> CompareAndPut(std::string_view key, std::string_view value,
                                 uint64_t expected) override {
    return store_->CompareAndPut(key, value, expected);
  }
  Status Delete(std::string_view key) override { return store_->Delete(key); }
  std::vector<Result<KvValue>> GetBatch(
      const std::vector<std::string_view>& keys, BatchKind kind) override {
    std::vector<Result<KvValue>> out;
    auto add = [&out](Result<HashStore::Value>&& v) {
      if (v.ok()) {
        out.push_back(KvValue{std::move(v->value), v->version});
      } else {
        out.push_back(v.status());
      }
    };
    if (kind == BatchKind::kMulti) {
      for (auto& v : store_->MultiGet(keys)) add(std::move(v));
      return out;
    }
    if (kind == BatchKind::kSequential) return KvClient::GetBatch(keys, kind);
    if (kind == BatchKind::kMultiAsync) {
      const size_t half = keys.size() / 2;
      std::vector<std::string_view> first(keys.begin(),
                                          keys.begin() + long(half));
      std::vector<std::string_view> second(keys.begin() + long(half),
                                           keys.end());
      std::optional<std::vector<Result<HashStore::Value>>> a, b;
      store_->MultiGetAsync(first, [&a](auto r) { a = std::move(r); });
      store_->MultiGetAsync(second, [&b](auto r) { b = std::move(r); });
      const Status st = session_->WaitAll();
      for (auto* part : {&a, &b}) {
        if (!part->has_value()) {
          for (size_t i = 0; i < (part == &a ? first : second).size(); ++i) {
            out.push_back(st.ok() ? Status::Internal("never completed") : st);
          }
          continue;
        }
        for (auto& v : **part) add(std::move(v));
      }
      return out;
    }
    std::vector<std::optional<Result<HashStore::Value>>> got(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      store_->GetAsync(keys[i], [&got, i](Result<HashStore::Value> v) {
        got[i] = std::move(v);
      });
    }
    const Status st = session_->WaitAll();
    for (auto& v : got) {
      if (v) {
        add(std::move(*v));
      } else {
        out.push_back(st.ok() ? Status::Internal("get never completed") : st);
      }
    }
    return out;
  }
  KvReadCounters read_counters() const override {
    const HashStore::ReadStats& s = store_->read_stats();
    return {s.onesided_gets + s.rpc_gets, s.retries, s.fallbacks};
  }

 private:
  std::unique_ptr<Session> session_;
  std::unique_ptr<HashStore> store_;
};

Result<std::unique_ptr<Session>> Connect(const std::string& address,
                                         Transport transport,
                                         const std::string& secret,
                                         ReadPath path) {
  SessionOptions o;
  o.server = address;
  o.transport = transport;
  o.secret = secret;
  o.read_path = path;
  return Session::Connect(o);
}

}  // namespace

HashStoreKv::HashStoreKv(std::string address, Transport transport,
                         std::string secret)
    : address_(std::move(address)),
      transport_(transport),
      secret_(std::move(secret)) {}

Result<std::unique_ptr<KvClient>> HashStoreKv::NewClient(Role role) {
  auto session =
      Connect(address_, transport_, secret_,
              role == Role::kWriter ? ReadPath::kRpc : ReadPath::kOneSided);
  if (!session.ok()) return session.status();
  auto store = HashStore::Open(session->get());
  if (!store.ok()) return store.status();
  return std::unique_ptr<KvClient>(
      new HashStoreClient(std::move(*session), std::move(*store)));
}

Result<KvStoreCounters> HashStoreKv::Counters() {
  auto session = Connect(address_, transport_, secret_, ReadPath::kRpc);
  if (!session.ok()) return session.status();
  auto stats = (*session)->Stats();
  if (!stats.ok()) return stats.status();
  KvStoreCounters c;
  c.growths = int64_t(stats->Get("hash_growths"));
  return c;
}

}  // namespace remem::testing
