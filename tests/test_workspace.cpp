// bd::Workspace (bd/base/workspace.hpp): each thread's scratch is its own, kept between calls,
// and freed when the workspace is released or goes.
#include <atomic>
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

    Counted* theirs = nullptr;
    std::thread([&] { theirs = &ws.local<Counted>(); }).join();
    CHECK(theirs != &a);                          // another thread: its own
    CHECK(theirs->values.empty());
    CHECK(Counted::live == 2);
    CHECK(ws.threads() == 2);

    bd::Workspace other;
    CHECK(&other.local<Counted>() != &a);         // another workspace: its own
    CHECK(Counted::live == 3);

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
  std::vector<Counted*> got(threads, nullptr);
  std::atomic<int> moved{0};  // Catch's assertions are not thread-safe: count, check after
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      Counted& mine = ws.local<Counted>();
      mine.values.assign(100, double(t));
      for (int k = 0; k < 1000; ++k) moved += &ws.local<Counted>() != &mine;
      got[static_cast<std::size_t>(t)] = &mine;
    });
  for (auto& p : pool) p.join();
  CHECK(moved == 0);
  for (int t = 0; t < threads; ++t) {
    CHECK(got[static_cast<std::size_t>(t)]->values.front() == double(t));
    for (int u = 0; u < t; ++u) CHECK(got[static_cast<std::size_t>(t)] != got[static_cast<std::size_t>(u)]);
  }
}
