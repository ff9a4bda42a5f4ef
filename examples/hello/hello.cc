// A first remem program, built against the installed SDK (see
// examples/hello/CMakeLists.txt and README.md, "The library"): connects to
// a server, stores a pair in the hash store, reads it back (one-sided when
// the server is on this host), and prints what the server counts.
//
//   hello HOST:PORT [--transport auto|shm|tcp]

#include <remem/hash.h>
#include <remem/session.h>
#include <remem/version.h>

#include <cstdio>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2 && argc != 4) {
    std::fprintf(stderr, "usage: %s HOST:PORT [--transport auto|shm|tcp]\n",
                 argv[0]);
    return 2;
  }
  remem::SessionOptions options;
  options.server = argv[1];
  if (argc == 4 && std::strcmp(argv[2], "--transport") == 0) {
    auto t = remem::ParseTransport(argv[3]);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
      return 2;
    }
    options.transport = *t;
  }
  auto session = remem::Session::Connect(options);
  if (!session.ok()) {
    std::fprintf(stderr, "connect: %s\n", session.status().ToString().c_str());
    return 1;
  }
  auto store = remem::HashStore::Open(session->get());
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    return 1;
  }
  auto version = (*store)->Put("hello", "world");
  if (!version.ok()) {
    std::fprintf(stderr, "put: %s\n", version.status().ToString().c_str());
    return 1;
  }
  auto value = (*store)->Get("hello");
  if (!value.ok() || value->value != "world") {
    std::fprintf(
        stderr, "get: %s\n",
        value.ok() ? "wrong value" : value.status().ToString().c_str());
    return 1;
  }
  auto stats = (*session)->Stats();
  if (!stats.ok()) {
    std::fprintf(stderr, "stats: %s\n", stats.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "remem %s: hello = %s (version %llu) over %s; the server holds "
      "%llu pairs\n",
      remem::kVersion, value->value.c_str(),
      static_cast<unsigned long long>(value->version),
      (*session)->transport().c_str(),
      static_cast<unsigned long long>(stats->Get("hash_pairs")));
  return 0;
}
