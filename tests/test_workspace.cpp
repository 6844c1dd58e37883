// bd::Workspace (bd/base/workspace.hpp): each thread's scratch is its own, kept between calls,
// and freed when the workspace is released or goes, or when its thread ends.
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <bd/base/workspace.hpp>

namespace {

/// A scratch type that counts its live instances.
struct Counted {
  static std::atomic<int> live;
  std::vector<double> values;
  Counted() { ++live; }
  ~Counted() { --live; }
};
std::atomic<int> Counted::live{0};

struct Other {
  int value = 7;
};

}  // namespace

TEST_CASE("a workspace keeps one instance of each scratch type per thread, until it is released", "[workspace]") {
  {
    bd::Workspace ws;
    Counted& a = ws.local<Counted>();
    a.values.assign(1000, 1.0);
    CHECK(&ws.local<Counted>() == &a);            // the same buffers on the next call
    CHECK(ws.local<Counted>().values.size() == 1000);
    CHECK(ws.local<Other>().value == 7);          // another type: another instance
    CHECK(static_cast<void*>(&ws.local<Other>()) != static_cast<void*>(&a));
    CHECK(Counted::live == 1);

    bool own = false;
    int live_inside = 0;
    std::size_t threads_inside = 0;
    std::thread([&] {
      Counted& theirs = ws.local<Counted>();
      own = &theirs != &a && theirs.values.empty();  // another thread: its own
      live_inside = Counted::live, threads_inside = ws.threads();
    }).join();
    CHECK(own);
    CHECK(live_inside == 2);
    CHECK(threads_inside == 2);
    CHECK(Counted::live == 1);                    // freed when its thread ended
    CHECK(ws.threads() == 1);

    bd::Workspace other;
    CHECK(&other.local<Counted>() != &a);         // another workspace: its own
    CHECK(Counted::live == 2);

    ws.release();
    CHECK(Counted::live == 1);
    CHECK(ws.threads() == 0);
    CHECK(ws.local<Counted>().values.empty());    // fresh after a release
    CHECK(Counted::live == 2);
  }
  CHECK(Counted::live == 0);                      // everything freed with the workspaces
}

TEST_CASE("threads taking scratch from one workspace at once each get their own", "[workspace]") {
  bd::Workspace ws;
  constexpr int threads = 8;
  std::vector<std::uintptr_t> got(threads, 0);
  std::vector<double> kept(threads, -1);
  std::atomic<int> moved{0}, arrived{0};  // Catch's assertions are not thread-safe: count, check after
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      Counted& mine = ws.local<Counted>();
      mine.values.assign(100, double(t));
      for (int k = 0; k < 1000; ++k) moved += &ws.local<Counted>() != &mine;
      got[static_cast<std::size_t>(t)] = reinterpret_cast<std::uintptr_t>(&mine);
      // Every thread holds its scratch until all have taken theirs: the addresses are then of
      // live objects, which a thread ending (and freeing its own) could not make reusable.
      ++arrived;
      while (arrived < threads) std::this_thread::yield();
      kept[static_cast<std::size_t>(t)] = ws.local<Counted>().values.front();
    });
  for (auto& p : pool) p.join();
  CHECK(moved == 0);
  for (int t = 0; t < threads; ++t) {
    CHECK(kept[static_cast<std::size_t>(t)] == double(t));
    for (int u = 0; u < t; ++u) CHECK(got[static_cast<std::size_t>(t)] != got[static_cast<std::size_t>(u)]);
  }
  CHECK(ws.threads() == 0);  // every worker's scratch freed as it ended
  CHECK(Counted::live == 0);
}

TEST_CASE("a thread's scratch goes with the thread, and a workspace may go before its threads", "[workspace]") {
  // A server's workers come and go: the workspace keeps only the live threads' scratch.
  bd::Workspace ws;
  for (int round = 0; round < 20; ++round) std::thread([&] { ws.local<Counted>().values.assign(1000, 1.0); }).join();
  CHECK(ws.threads() == 0);
  CHECK(Counted::live == 0);
  // A thread outliving the workspace it took scratch from: the workspace frees it, and the
  // thread's end finds nothing left to free.
  std::atomic<bool> taken{false}, gone{false};
  auto workspace = std::make_unique<bd::Workspace>();
  std::thread worker([&] {
    workspace->local<Counted>();
    taken = true;
    while (!gone) std::this_thread::yield();
  });
  while (!taken) std::this_thread::yield();
  CHECK(Counted::live == 1);
  workspace.reset();
  CHECK(Counted::live == 0);
  gone = true;
  worker.join();
  CHECK(Counted::live == 0);
}
