#include "ops/functions.h"

#include <dlfcn.h>

namespace remem::ops {

FunctionTable::~FunctionTable() {
  functions_.clear();
  for (void* h : handles_) dlclose(h);
}

Status FunctionTable::Load(const std::string& path) {
  auto refuse = [&](const std::string& why) {
    return Status::InvalidArgument("--ops-library " + path + ": " + why);
  };
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    return refuse(std::string("cannot be loaded: ") +
                  (e ? e : "dlopen failed"));
  }
  auto entry = reinterpret_cast<remem_ops_library_fn>(
      dlsym(h, REMEM_OPS_LIBRARY_SYMBOL));
  const remem_ops_library* lib = entry ? entry() : nullptr;
  Status st;
  if (entry == nullptr) {
    st = refuse("it exports no " + std::string(REMEM_OPS_LIBRARY_SYMBOL) +
                " (see remem/ops_plugin.h)");
  } else if (lib == nullptr) {
    st = refuse(std::string(REMEM_OPS_LIBRARY_SYMBOL) + " returned null");
  } else if (lib->abi_version != REMEM_OPS_ABI_VERSION) {
    st =
        refuse("ABI version " + std::to_string(lib->abi_version) +
               ", this server speaks " + std::to_string(REMEM_OPS_ABI_VERSION));
  } else if (lib->count > 0 && lib->functions == nullptr) {
    st = refuse("its function list is null");
  }
  std::map<uint32_t, UserFunction> added;
  for (uint32_t i = 0; st.ok() && i < lib->count; ++i) {
    const remem_ops_function& f = lib->functions[i];
    const std::string name = f.name ? f.name : "";
    if (f.id == 0 || f.update == nullptr) {
      st = refuse("function '" + name + "' has id 0 or no update function");
    } else if (functions_.count(f.id) || added.count(f.id)) {
      st = refuse("function id " + std::to_string(f.id) + " ('" + name +
                  "') is already registered");
    } else {
      added[f.id] = UserFunction{f.id, name, f.update};
    }
  }
  if (!st.ok()) {
    dlclose(h);
    return st;
  }
  functions_.merge(added);
  handles_.push_back(h);
  return Status::OK();
}

const UserFunction* FunctionTable::Find(uint32_t id) const {
  auto it = functions_.find(id);
  return it == functions_.end() ? nullptr : &it->second;
}

std::vector<std::string> FunctionTable::Describe() const {
  std::vector<std::string> out;
  for (const auto& [id, f] : functions_) {
    out.push_back(std::to_string(id) + ":" + f.name);
  }
  return out;
}

}  // namespace remem::ops
