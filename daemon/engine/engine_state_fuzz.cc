// libFuzzer target for the loader of the engine's handover state
// (MqEngine::LoadState, daemon/engine/engine_state.cc; issue 33): arbitrary
// bytes as the state of one shard of a small node (test_world.h: a job of
// three endpoints on real segments and a pool, one engine or two shards).
// Built and run for a bounded time by daemon/engine/engine_state_fuzz.sh,
// from the seed corpus daemon/engine/engine_state_fuzz_corpus/ (states the
// node saved at every step of engine_state_test's scenario, both shard
// counts; ENGINE_STATE_FUZZ_WRITE_SEEDS=DIR writes it).
//
// Input: byte 0 picks the node (bit 0: two shards) and the shard loaded
// (bit 1); byte 1 how many rounds of traffic run after a load; the rest is
// the state.
//
// Checked beyond "no crash, no sanitizer report":
//   1. A refused state changed nothing: no charge against the job's or the
//      uid's budgets, no posted receive counted, no queue filled.
//   2. A loaded state runs: engine passes, clients reaping (and releasing
//      the chunks they are handed) and posting receives, then every
//      endpoint removed, after which nothing is charged to the job or the
//      uid (the loader's charges are exactly what removal gives back).
// At exit it prints how many states loaded (per shard count) and how many
// were refused ("engine_state_fuzz: reached ..."): a run that never loaded
// a state has checked only the refusals.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "daemon/engine/test_world.h"
#include "tests/fuzz_seeds.h"

namespace {

using psmd::EndpointTestPeer;
using psmd::Status;
using psmd::test_world::kEndpoints;
using psmd::test_world::World;

struct Reached {
  uint64_t loaded[2] = {};  // by shard count
  uint64_t refused = 0;
  ~Reached() {
    printf("engine_state_fuzz: reached loaded=%llu,%llu refused=%llu\n",
           static_cast<unsigned long long>(loaded[0]),
           static_cast<unsigned long long>(loaded[1]),
           static_cast<unsigned long long>(refused));
  }
} reached;

void Check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "engine_state_fuzz: property violated: %s\n", what);
    abort();
  }
}

bool NothingCharged(World& w) {
  return w.job().unexpected_cost.load() == 0 &&
         w.job().account().unexpected_cost.load() == 0 &&
         w.job().posted_recvs.load() == 0 &&
         w.job().account().posted_recvs.load() == 0;
}

std::string Header(uint32_t shards, uint32_t shard, uint8_t rounds) {
  return std::string{static_cast<char>((shards - 1) | (shard << 1)),
                     static_cast<char>(rounds)};
}

// States saved at each step of the handover scenario, for each shard.
std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  for (uint32_t shards = 1; shards <= 2; shards++) {
    // Steps 0-6: up to a transfer mid-stream and budget-held sends (held
    // items with two shards); later steps add a thousand overflowing
    // completions, past the run's max_len.
    for (int step = 0; step <= 6; step++) {
      World w(shards);
      psmd::test_world::RunScenario(w, -1, step);
      if (!w.Quiesce()) abort();
      const std::vector<std::string> states = w.Save();
      for (uint32_t s = 0; s < shards; s++) {
        seeds.push_back(Header(shards, s, 4) + states[s]);
      }
    }
  }
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  psmd::fuzz::WriteSeedsIfAsked("ENGINE_STATE_FUZZ_WRITE_SEEDS",
                                "engine_state_fuzz", Seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint32_t shards = 1 + (data[0] & 1);
  const uint32_t shard = (data[0] >> 1) & (shards - 1);
  const uint32_t rounds = data[1] % 8;
  const std::string state(reinterpret_cast<const char*>(data + 2), size - 2);
  World w(shards);
  const Status st = w.Load(shard, state);
  if (!st.ok()) {
    reached.refused++;
    // Property 1.
    Check(NothingCharged(w), "a refused state charged the budgets");
    for (uint32_t i = 0; i < kEndpoints; i++) {
      EndpointTestPeer peer(w.ep(i));
      Check(peer.posted().empty() && peer.unexpected().empty() &&
                peer.cq_overflow().empty() && peer.held_sends().empty() &&
                peer.claimed() == 0,
            "a refused state filled a queue");
    }
    return 0;
  }
  reached.loaded[shards - 1]++;
  // Property 2: traffic on what loaded, then every endpoint closed.
  for (uint32_t round = 0; round < rounds; round++) {
    w.Poll();
    for (uint32_t at = 0; at < kEndpoints; at++) {
      w.Reap(at);
      const uint32_t tag[3] = {0, 0, 0};
      w.Offer(at, psmd::shm::PrepRecv(psmd::shm::kAnySlot, w.Token(at), tag,
                                      tag, 1 << 20));
    }
  }
  w.Poll();
  w.CloseAll();
  Check(NothingCharged(w), "budgets still charged once every endpoint left");
  return 0;
}
