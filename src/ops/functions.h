// ops::FunctionTable: the user-defined update functions and reductions of a
// server, loaded
// at start from the shared libraries named with --ops-library
// (remem/ops_plugin.h gives the C interface a library implements).
//
// Thread contract: Load runs before the server threads start (Init); after
// that the table is read-only and Find may be called from any thread.
// Libraries stay loaded until the table is destroyed.

#ifndef REMEM_OPS_FUNCTIONS_H_
#define REMEM_OPS_FUNCTIONS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ops/apply.h"
#include "remem/status.h"

namespace remem::ops {

class FunctionTable final : public FunctionLookup {
 public:
  FunctionTable() = default;
  ~FunctionTable() override;
  FunctionTable(const FunctionTable&) = delete;
  FunctionTable& operator=(const FunctionTable&) = delete;

  // dlopens `path` and registers every function it lists (Register).
  // InvalidArgument (naming the path and what is wrong) if it cannot be
  // loaded, lacks remem_ops_library_v1 or Register refuses it; nothing of
  // that library is registered then.
  Status Load(const std::string& path);
  // Registers the functions of `lib` (reading only the fields its
  // abi_version has: 1 or 2). InvalidArgument, with `origin` (e.g.
  // "--ops-library PATH") and what is wrong, for a null library, an
  // unknown ABI version, a null list, a null function, an id 0, an id
  // already registered (by either kind) or a reduction that accepts no
  // known element type; nothing of `lib` is registered then.
  Status Register(const remem_ops_library* lib, const std::string& origin);
  const UserFunction* Find(uint32_t id) const override;
  const UserReduction* FindReduction(uint32_t id) const override;
  // Update functions and reductions registered.
  size_t size() const { return functions_.size() + reductions_.size(); }
  // "id:name" of every function (update functions, then reductions), in
  // id order (stats, logs).
  std::vector<std::string> Describe() const;

 private:
  std::map<uint32_t, UserFunction> functions_;
  std::map<uint32_t, UserReduction> reductions_;
  std::vector<void*> handles_;
};

}  // namespace remem::ops

#endif  // REMEM_OPS_FUNCTIONS_H_
