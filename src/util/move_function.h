// util::MoveFunction<R(Args...)>: a move-only std::function. It holds
// callables that cannot be copied (a lambda that owns a server::Responder or
// a unique_ptr), and stores small ones (up to kInline bytes) without
// allocating, which matters on the per-request paths.
//
// Thread contract: a value; one object is used by one thread at a time.

#ifndef REMEM_UTIL_MOVE_FUNCTION_H_
#define REMEM_UTIL_MOVE_FUNCTION_H_

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace remem::util {

template <typename Signature>
class MoveFunction;

template <typename R, typename... Args>
class MoveFunction<R(Args...)> {
 public:
  static constexpr size_t kInline = 6 * sizeof(void*);

  MoveFunction() = default;
  MoveFunction(std::nullptr_t) {}  // NOLINT: implicit, as std::function's
  template <typename F,
            typename = std::enable_if_t<
                !std::is_same_v<std::decay_t<F>, MoveFunction> &&
                std::is_invocable_r_v<R, std::decay_t<F>&, Args...>>>
  MoveFunction(F&& f) {  // NOLINT: implicit, as std::function's
    using Fn = std::decay_t<F>;
    if constexpr (sizeof(Fn) <= kInline &&
                  alignof(Fn) <= alignof(std::max_align_t) &&
                  std::is_nothrow_move_constructible_v<Fn>) {
      ::new (static_cast<void*>(&storage_)) Fn(std::forward<F>(f));
      ops_ = &InlineOps<Fn>::kOps;
    } else {
      *reinterpret_cast<Fn**>(&storage_) = new Fn(std::forward<F>(f));
      ops_ = &HeapOps<Fn>::kOps;
    }
  }
  MoveFunction(MoveFunction&& other) noexcept { MoveFrom(other); }
  MoveFunction& operator=(MoveFunction&& other) noexcept {
    if (this != &other) {
      Reset();
      MoveFrom(other);
    }
    return *this;
  }
  MoveFunction& operator=(std::nullptr_t) {
    Reset();
    return *this;
  }
  MoveFunction(const MoveFunction&) = delete;
  MoveFunction& operator=(const MoveFunction&) = delete;
  ~MoveFunction() { Reset(); }

  explicit operator bool() const { return ops_ != nullptr; }
  R operator()(Args... args) {
    return ops_->call(&storage_, std::forward<Args>(args)...);
  }

 private:
  struct Ops {
    R (*call)(void*, Args&&...);
    void (*move)(void* from, void* to);  // move-construct `to`, destroy from
    void (*destroy)(void*);
  };
  template <typename Fn>
  struct InlineOps {
    static R Call(void* s, Args&&... a) {
      return (*static_cast<Fn*>(s))(std::forward<Args>(a)...);
    }
    static void Move(void* from, void* to) {
      ::new (to) Fn(std::move(*static_cast<Fn*>(from)));
      static_cast<Fn*>(from)->~Fn();
    }
    static void Destroy(void* s) { static_cast<Fn*>(s)->~Fn(); }
    static constexpr Ops kOps{&Call, &Move, &Destroy};
  };
  template <typename Fn>
  struct HeapOps {
    static R Call(void* s, Args&&... a) {
      return (**static_cast<Fn**>(s))(std::forward<Args>(a)...);
    }
    static void Move(void* from, void* to) {
      *static_cast<Fn**>(to) = *static_cast<Fn**>(from);
    }
    static void Destroy(void* s) { delete *static_cast<Fn**>(s); }
    static constexpr Ops kOps{&Call, &Move, &Destroy};
  };
  void MoveFrom(MoveFunction& other) {
    if (other.ops_ != nullptr) {
      other.ops_->move(&other.storage_, &storage_);
      ops_ = other.ops_;
      other.ops_ = nullptr;
    }
  }
  void Reset() {
    if (ops_ != nullptr) {
      ops_->destroy(&storage_);
      ops_ = nullptr;
    }
  }

  alignas(std::max_align_t) unsigned char storage_[kInline];
  const Ops* ops_ = nullptr;
};

}  // namespace remem::util

#endif  // REMEM_UTIL_MOVE_FUNCTION_H_
