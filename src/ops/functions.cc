#include "ops/functions.h"

#include <dlfcn.h>

namespace remem::ops {

namespace {

// Every element type a reduction may accept.
constexpr uint32_t kKnownTypes =
    REMEM_OPS_TYPE_BIT(REMEM_OPS_INT64) | REMEM_OPS_TYPE_BIT(REMEM_OPS_DOUBLE) |
    REMEM_OPS_TYPE_BIT(REMEM_OPS_FLOAT) | REMEM_OPS_TYPE_BIT(REMEM_OPS_INT32);

}  // namespace

FunctionTable::~FunctionTable() {
  functions_.clear();
  reductions_.clear();
  for (void* h : handles_) dlclose(h);
}

Status FunctionTable::Load(const std::string& path) {
  const std::string origin = "--ops-library " + path;
  // dlopen("") would be the server itself.
  if (path.empty()) {
    return Status::InvalidArgument("--ops-library needs a library's path");
  }
  // A name without a slash is a file in the current directory, as on the
  // rest of the command line: dlopen would search the library path for it
  // (LD_LIBRARY_PATH, the system's directories) and load whatever library
  // of that name it found there.
  const std::string file =
      path.find('/') == std::string::npos ? "./" + path : path;
  void* h = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    return Status::InvalidArgument(
        origin + ": cannot be loaded: " + (e ? e : "dlopen failed"));
  }
  auto entry = reinterpret_cast<remem_ops_library_fn>(
      dlsym(h, REMEM_OPS_LIBRARY_SYMBOL));
  Status st =
      entry == nullptr
          ? Status::InvalidArgument(origin + ": it exports no " +
                                    std::string(REMEM_OPS_LIBRARY_SYMBOL) +
                                    " (see remem/ops_plugin.h)")
          : Register(entry(), origin);
  if (!st.ok()) {
    dlclose(h);
    return st;
  }
  handles_.push_back(h);
  return Status::OK();
}

Status FunctionTable::Register(const remem_ops_library* lib,
                               const std::string& origin) {
  auto refuse = [&](const std::string& why) {
    return Status::InvalidArgument(origin + ": " + why);
  };
  if (lib == nullptr) {
    return refuse(std::string(REMEM_OPS_LIBRARY_SYMBOL) + " returned null");
  }
  if (lib->abi_version < 1 || lib->abi_version > REMEM_OPS_ABI_VERSION) {
    return refuse("ABI version " + std::to_string(lib->abi_version) +
                  ", this server speaks 1 to " +
                  std::to_string(REMEM_OPS_ABI_VERSION));
  }
  // A version 1 library's struct ends before the reductions: not read.
  const uint32_t reduction_count =
      lib->abi_version >= 2 ? lib->reduction_count : 0;
  if (lib->count > 0 && lib->functions == nullptr) {
    return refuse("its function list is null (count " +
                  std::to_string(lib->count) + ")");
  }
  if (reduction_count > 0 && lib->reductions == nullptr) {
    return refuse("its reduction list is null (reduction_count " +
                  std::to_string(reduction_count) + ")");
  }
  auto taken = [&](uint32_t id, const auto& fs, const auto& rs) {
    return functions_.count(id) || reductions_.count(id) || fs.count(id) ||
           rs.count(id);
  };
  std::map<uint32_t, UserFunction> fs;
  std::map<uint32_t, UserReduction> rs;
  for (uint32_t i = 0; i < lib->count; ++i) {
    const remem_ops_function& f = lib->functions[i];
    const std::string name = f.name ? f.name : "";
    if (f.id == 0 || f.update == nullptr) {
      return refuse("function '" + name + "' has id 0 or no update function");
    }
    if (taken(f.id, fs, rs)) {
      return refuse("function id " + std::to_string(f.id) + " ('" + name +
                    "') is already registered");
    }
    fs[f.id] = UserFunction{f.id, name, f.update};
  }
  for (uint32_t i = 0; i < reduction_count; ++i) {
    const remem_ops_reduction& r = lib->reductions[i];
    const std::string name = r.name ? r.name : "";
    if (r.id == 0 || r.reduce == nullptr) {
      return refuse("reduction '" + name + "' has id 0 or no function");
    }
    if ((r.elem_types & kKnownTypes) == 0) {
      return refuse("reduction '" + name + "' accepts no known element type");
    }
    if (taken(r.id, fs, rs)) {
      return refuse("function id " + std::to_string(r.id) + " ('" + name +
                    "') is already registered");
    }
    rs[r.id] = UserReduction{r.id, name, r.elem_types & kKnownTypes, r.reduce};
  }
  functions_.merge(fs);
  reductions_.merge(rs);
  return Status::OK();
}

const UserFunction* FunctionTable::Find(uint32_t id) const {
  auto it = functions_.find(id);
  return it == functions_.end() ? nullptr : &it->second;
}

const UserReduction* FunctionTable::FindReduction(uint32_t id) const {
  auto it = reductions_.find(id);
  return it == reductions_.end() ? nullptr : &it->second;
}

std::vector<std::string> FunctionTable::Describe() const {
  std::vector<std::string> out;
  for (const auto& [id, f] : functions_) {
    out.push_back(std::to_string(id) + ":" + f.name);
  }
  for (const auto& [id, r] : reductions_) {
    out.push_back(std::to_string(id) + ":" + r.name);
  }
  return out;
}

}  // namespace remem::ops
