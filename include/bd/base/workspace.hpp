// bd/base/workspace.hpp — the scratch memory of bd's computations, owned by the caller.
//
// Preparation runs many products of one shape (864 for DeepSeek-V2-Lite), each needing a few
// megabytes of intermediates: blocks of r×n and (m−r)×r, r×r inverses, the GEMM's packing
// space. Allocating them afresh for every product costs more than some of the products: blocks
// at or above glibc's mmap threshold (128 KiB: an r×r double at r = 128) are mapped, faulted in
// and zeroed by the kernel each time. A Workspace keeps them instead, the way LAPACK takes a
// `work` array and BLIS keeps memory pools: each thread that computes for it gets its own
// arena, in which each stage keeps one instance of its scratch type (the fit's buffers, the
// GEMM's packing space, an inverse's blocks), reused by every later call of that stage on that
// thread. Everything is freed when the Workspace goes (or release() is called).
//
//   bd::Workspace ws;                      // one per program, or per worker
//   auto q = bd::decompose_shared<Eigen::half>(Us, Vs, opts, ws);   // reuses ws's buffers
//
// A stage reads its buffers as `ws.local<Scratch>()`: the calling thread's Scratch, default-
// constructed on first use. Scratch types are named for the stage that owns them; two stages
// never share one, so a stage may call another while holding its own buffers.
//
// Functions that take no Workspace use default_workspace(), one per process: the kernels' GEMMs
// called from layers at inference, for instance, keep their packing space there, and the
// attention layers their Q, K, V and heads' output (as large as the longest call's: 4.5 GiB after
// a 16k-token forward at DeepSeek-V3's shape) until release().
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bd/base/code_size.hpp"

namespace bd {

class Workspace {
public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  /// The calling thread's instance of Scratch, default-constructed on its first use. The
  /// reference stays valid until release() or the Workspace's end.
  template <typename Scratch>
  Scratch& local() {
    void* object = find_or_create(
        &type_key<Scratch>, [] { return static_cast<void*>(new Scratch()); },
        [](void* p) { delete static_cast<Scratch*>(p); });
    return *static_cast<Scratch*>(object);
  }

  /// Frees every buffer of every thread. Not while a computation is using this workspace.
  void release() {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->arenas.clear();
  }

  /// Threads that have scratch here. A thread's scratch is freed when the thread ends, so a
  /// server whose workers come and go keeps only the live ones'.
  std::size_t threads() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->arenas.size();
  }

private:
  template <typename Scratch>
  static constexpr char type_key = 0;  // one address per scratch type, without RTTI

  using Owned = std::unique_ptr<void, void (*)(void*)>;
  struct Slot {
    const void* key;
    Owned object;
  };
  using Arena = std::vector<Slot>;
  struct State {
    std::mutex mutex;
    std::unordered_map<std::thread::id, std::unique_ptr<Arena>> arenas;
  };

  /// Each thread's record of the workspaces it has an arena in; when the thread ends, it drops
  /// its arena from every one still alive (the weak pointers: a workspace may go first). It holds
  /// no scratch itself.
  struct ThreadExit {
    std::vector<std::weak_ptr<State>> states;
    ~ThreadExit() {
      const std::thread::id me = std::this_thread::get_id();
      for (const auto& weak : states) {
        const std::shared_ptr<State> state = weak.lock();
        if (!state) continue;
        std::unique_ptr<Arena> arena;  // freed outside the lock
        std::lock_guard<std::mutex> lock(state->mutex);
        const auto it = state->arenas.find(me);
        if (it == state->arenas.end()) continue;
        arena = std::move(it->second);
        state->arenas.erase(it);
      }
    }
  };

  /// local()'s lookup, one function for every scratch type (and not inlined into each of the
  /// stages that call local(): a lock, a hash lookup and a search, at a few dozen call sites).
  BD_NOINLINE void* find_or_create(const void* key, void* (*create)(), void (*destroy)(void*)) {
    Arena& arena = arena_of_this_thread();
    for (auto& slot : arena)
      if (slot.key == key) return slot.object.get();
    Owned object(create(), destroy);
    arena.push_back(Slot{key, std::move(object)});
    return arena.back().object.get();
  }

  Arena& arena_of_this_thread() {
    std::unique_lock<std::mutex> lock(state_->mutex);
    auto& arena = state_->arenas[std::this_thread::get_id()];
    if (!arena) {
      arena = std::make_unique<Arena>();
      lock.unlock();
      thread_local ThreadExit at_exit;
      const auto same = [&](const std::weak_ptr<State>& w) { return !w.owner_before(state_) && !state_.owner_before(w); };
      auto& states = at_exit.states;  // a workspace gone before this thread is dropped here
      states.erase(std::remove_if(states.begin(), states.end(), [](const auto& w) { return w.expired(); }), states.end());
      if (std::none_of(states.begin(), states.end(), same)) states.push_back(state_);
    }
    return *arena;  // only this thread reads or grows it; the map never moves it
  }

  std::shared_ptr<State> state_ = std::make_shared<State>();
};

/// A grow-only array of T for a stage's scratch (a Workspace's type holds one or more): reserve(n)
/// returns room for n values, reallocating only when n exceeds the largest request so far, and
/// never fills it (the stage writes every value it reads). Taken before any parallel region, so
/// nothing inside one allocates or throws.
template <typename T>
struct ScratchBuffer {
  std::unique_ptr<T[]> buffer;
  std::size_t capacity = 0;

  T* reserve(std::size_t count) {
    if (capacity < count) {
      buffer.reset();
      buffer.reset(new T[count]);  // default-initialised: no fill
      capacity = count;
    }
    return buffer.get();
  }
};

/// The process's workspace, used by every bd function not given one. Its buffers last until
/// the process ends or default_workspace().release() (with no bd computation running).
inline Workspace& default_workspace() {
  static Workspace workspace;
  return workspace;
}

}  // namespace bd
