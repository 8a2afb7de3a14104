// A small node for tests of the engine's handover (issue 33; mq_engine.h,
// "Handover to a successor process"): one job of kEndpoints endpoints on
// real segments and a real pool, on one engine or two shards, the test
// playing every client (its own mappings of the segments, as a client
// process has), and the successor made over the same shared memory
// (Reload). Shared by engine_state_test and engine_state_fuzz (whose seeds
// are states this world saves).
//
// Thread-safety: one thread (the test's) plays every worker and client.
#ifndef PSMD_DAEMON_ENGINE_TEST_WORLD_H_
#define PSMD_DAEMON_ENGINE_TEST_WORLD_H_

#include <psm2.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/engine/mq_engine.h"
#include "daemon/engine/test_endpoint.h"
#include "daemon/handover/state_codec.h"
#include "shm/payload.h"
#include "shm/pool.h"
#include "shm/segment.h"

namespace psmd::test_world {

inline constexpr uint32_t kRingCapacity = 64;
inline constexpr uint64_t kRegionBytes = 1 << 20;
inline constexpr uint32_t kEndpoints = 3;
inline constexpr uint64_t kBudget = 1 << 20;

[[noreturn]] inline void Die(const char* what) {
  fprintf(stderr, "test world: %s\n", what);
  abort();
}

// A node with one job of kEndpoints endpoints (ids 1..kEndpoints, each
// connected to all at slot = index), on `shards` engines.
class World {
 public:
  explicit World(uint32_t shards) : shards_(shards) {
    std::string error;
    shm::Mapping pool;
    if (!shm::Mapping::Create("state-pool", kEndpoints * kRegionBytes,
                              geteuid(), getegid(), &pool, &error)) {
      Die(error.c_str());
    }
    client_job_ = std::make_shared<Job>(
        JobKey{Uuid{7}, geteuid()}, std::move(pool), kEndpoints, kRegionBytes,
        std::make_shared<UidAccount>());
    job_ = client_job_;
    MakeEngines();
    for (uint32_t i = 0; i < kEndpoints; i++) {
      auto ep = MakeTestEndpoint(job_, *job_->TakeRegion(), i + 1,
                                 0x1000 + i + 1, kRingCapacity, kBudget);
      Client c;
      c.segment = DupMapping(ep->segment());  // the client's own mapping
      c.rings = shm::ClientRingsOf(c.segment.base(), ep->geometry());
      c.arena = shm::SendArena(client_job_->pool().base(), ep->region().offset,
                               ep->region().bytes);
      clients_.push_back(std::move(c));
      EngineOf(ep->id()).Add(ep);
      endpoints_.push_back(ep);
    }
    for (uint32_t i = 0; i < kEndpoints; i++) {
      for (uint32_t j = 0; j < kEndpoints; j++) {
        EngineOf(i + 1).SetPeer(i + 1, j, PeerLink{j + 1, 0x1000 + j + 1});
      }
    }
  }

  ~World() { CloseAll(); }

  // Removes every endpoint (as their clients closing) and lets the shards
  // finish what crosses between them.
  void CloseAll() {
    for (auto& ep : endpoints_) EngineOf(ep->id()).Remove(ep->id());
    endpoints_.clear();
    Poll();
  }

  MqEngine& EngineOf(uint32_t id) {
    return *engines_[MqEngine::ShardOf(id, shards_)];
  }
  Endpoint& ep(uint32_t i) { return *endpoints_[i]; }
  Job& job() { return *job_; }

  void Submit(uint32_t from, const shm::SubmissionDesc& d) {
    if (!Offer(from, d)) Die("a submission ring is full");
  }
  // The same, false when the ring is full (or its indices are off: a
  // loaded state may name any ring position).
  bool Offer(uint32_t from, const shm::SubmissionDesc& d) {
    auto& r = shm::TraitsOf(d.op).ring == shm::Ring::kMessage
                  ? clients_[from].rings.msg_sq
                  : clients_[from].rings.ctl_sq;
    return r.TryPush(d);
  }
  uint64_t Token(uint32_t from) { return (uint64_t{from} << 32) | next_++; }

  void Send(uint32_t from, uint32_t to, uint32_t tag0, uint32_t len,
            uint8_t flags = 0, bool rndv = false) {
    const uint32_t tag[3] = {tag0, 0, 0};
    shm::SubmissionDesc d = shm::PrepSend(to, Token(from), tag, len, rndv);
    d.flags |= flags;
    if (shm::PayloadInPool(d)) {
      auto off = clients_[from].arena.Allocate(len);
      if (!off) Die("the send region is full");
      std::memset(client_job_->pool().base() + *off, 'a' + tag0 % 26, len);
      d.body.pool.pool_offset = *off;
    } else if (!rndv) {
      std::memset(d.body.inline_data, 'a' + tag0 % 26, len);
    }
    Submit(from, d);
  }
  void Recv(uint32_t at, uint32_t slot, uint32_t tag0, bool exact,
            uint32_t capacity) {
    const uint32_t tag[3] = {tag0, 0, 0};
    const uint32_t all[3] = {~0u, ~0u, ~0u};
    const uint32_t none[3] = {0, 0, 0};
    Submit(at,
           shm::PrepRecv(slot, Token(at), tag, exact ? all : none, capacity));
  }
  void Probe(uint32_t at, uint32_t slot, uint32_t tag0, uint64_t token) {
    const uint32_t tag[3] = {tag0, 0, 0};
    const uint32_t all[3] = {~0u, ~0u, ~0u};
    Submit(at, shm::PrepProbe(slot, token, tag, all, /*claim=*/true));
  }
  void RndvData(uint32_t from, uint64_t transfer, uint64_t offset,
                uint32_t len) {
    shm::SubmissionDesc d =
        shm::PrepRndvData(Token(from), transfer, offset, len);
    auto off = clients_[from].arena.Allocate(len);
    if (!off) Die("the send region is full");
    d.body.pool.pool_offset = *off;
    Submit(from, d);
  }
  void Am(uint32_t from, uint32_t slot) {
    Submit(from, shm::PrepActiveMessage(false, slot, Token(from), 1, 1, 8));
  }

  // Turns every shard until none has work (bounded).
  void Poll() {
    for (int i = 0; i < 200; i++) {
      bool did = false;
      for (auto& e : engines_) did |= e->PollAll();
      for (auto& e : engines_) e->NotifyClients();
      if (!did) break;
    }
  }

  // What endpoint `at`'s client reaps, in order (releasing chunks as a
  // client does), appended to its record.
  std::vector<shm::CompletionDesc> Reap(uint32_t at, size_t max = SIZE_MAX) {
    std::vector<shm::CompletionDesc> out;
    shm::CompletionDesc c;
    while (out.size() < max && clients_[at].rings.cq.TryPop(&c)) {
      shm::PayloadOf(client_job_->pool().base(), c).Release();
      out.push_back(c);
      record_[at].push_back(c);
    }
    return out;
  }
  const std::vector<shm::CompletionDesc>& record(uint32_t at) {
    return record_[at];
  }

  // The handover's first half: PollQuiescing rounds until every shard is
  // Quiesced (mq_engine.h's protocol). False if it never was.
  bool Quiesce(int max_rounds = 1000) {
    for (int round = 0; round < max_rounds; round++) {
      bool did = false;
      for (auto& e : engines_) did |= e->PollQuiescing();
      bool quiet = !did;
      for (auto& e : engines_) quiet &= e->Quiesced();
      if (quiet) return true;
    }
    return false;
  }
  std::vector<std::string> Save() {
    std::vector<std::string> states;
    for (auto& e : engines_) {
      handover::StateWriter w;
      e->SaveState(w);
      states.push_back(w.Take());
    }
    return states;
  }
  // The successor: the engines, endpoints and job object destroyed and
  // made anew over the same shared memory (a job object for the same
  // pool, charged nothing, regions handed out as before; endpoints
  // re-made over their segments); states[s], if any, loaded into shard s.
  // The first refusal, or OK.
  Status Reload(const std::vector<std::optional<std::string>>& states) {
    auto job =
        std::make_shared<Job>(job_->key(), DupMapping(job_->pool()), kEndpoints,
                              kRegionBytes, std::make_shared<UidAccount>());
    for (uint32_t i = 0; i < kEndpoints; i++) job->TakeRegion();
    std::vector<std::shared_ptr<Endpoint>> fresh;
    for (auto& ep : endpoints_)
      fresh.push_back(RemakeTestEndpoint(*ep, job, kBudget));
    endpoints_.clear();
    engines_.clear();  // the old engines and endpoints go
    crossing_.reset();
    job_ = job;
    MakeEngines();
    endpoints_ = fresh;
    for (auto& ep : endpoints_) EngineOf(ep->id()).Add(ep);
    Status first;
    for (uint32_t s = 0; s < shards_ && s < states.size(); s++) {
      if (!states[s]) continue;
      Status st = Load(s, *states[s]);
      if (!st.ok() && first.ok()) first = st;
    }
    return first;
  }
  // State into shard `shard` of the engines as they are (fresh).
  Status Load(uint32_t shard, const std::string& state) {
    handover::StateReader r(state.data(), state.size());
    return engines_[shard]->LoadState(r);
  }
  // The whole handover; the first refusal, or OK.
  Status Handover() {
    if (!Quiesce()) return Status(PSM2_INTERNAL_ERR, "never quiesced");
    const std::vector<std::string> states = Save();
    return Reload({states.begin(), states.end()});
  }

  uint32_t shards() const { return shards_; }
  bool CreditsAgree() const {
    std::vector<const MqEngine*> shards;
    for (auto& e : engines_) shards.push_back(e.get());
    return MqEngine::CreditsAgree(shards);
  }

 private:
  void MakeEngines() {
    crossing_ = std::make_unique<Crossing>(shards_);
    for (uint32_t s = 0; s < shards_; s++) {
      engines_.push_back(std::make_unique<MqEngine>(1 << 30, 1 << 30, 1 << 30));
      if (shards_ > 1) engines_.back()->JoinShards(crossing_.get(), s);
    }
  }

  struct Client {
    shm::Mapping segment;
    shm::ClientRings rings;
    shm::SendArena arena;
  };
  const uint32_t shards_;
  std::shared_ptr<Job> client_job_;  // the clients' view of the pool
  std::shared_ptr<Job> job_;         // the engines' (a new one per handover)
  std::unique_ptr<Crossing> crossing_;
  std::vector<std::unique_ptr<MqEngine>> engines_;
  std::vector<std::shared_ptr<Endpoint>> endpoints_;
  std::vector<Client> clients_;
  std::vector<shm::CompletionDesc> record_[kEndpoints];
  uint32_t next_ = 1;
};

// The transfer a kRndvGo among `cs` names, or 0.
inline uint64_t GoOf(const std::vector<shm::CompletionDesc>& cs,
                     uint32_t* bytes) {
  for (const auto& c : cs) {
    if (c.op == shm::CompleteOp::kRndvGo) {
      *bytes = c.body.go.send_bytes;
      return c.body.go.transfer;
    }
  }
  return 0;
}

// The handover scenario of engine_state_test (its seeds, for the loader's
// fuzz target): the steps;  `cut` is the step after which the world is handed
// over (-1: never). Endpoint 0 and 1 talk; 2 receives and is flooded.
// `stop_after`: the step after which it returns, without the end.
inline void RunScenario(World& w, int cut, int stop_after = -1) {
  uint64_t transfer = 0;
  uint32_t go_bytes = 0;
  // Endpoint 0 streams every rendezvous it is cleared for, whole.
  auto stream = [&](const std::vector<shm::CompletionDesc>& cs) {
    for (const auto& c : cs) {
      if (c.op == shm::CompleteOp::kRndvGo && c.body.go.send_bytes > 0)
        w.RndvData(0, c.body.go.transfer, 0, c.body.go.send_bytes);
    }
  };
  std::vector<std::function<void()>> steps = {
      // Posted receives: wildcard, specific, any source exact.
      [&] {
        w.Recv(2, shm::kAnySlot, 0, /*exact=*/false, 4096);
        w.Recv(2, 0, 7, true, 4096);
        w.Recv(2, shm::kAnySlot, 9, true, 4096);
        w.Recv(2, 1, 7, true, 4096);
      },
      // Unexpected eager (inline, pool, sync) and rendezvous at 1.
      [&] {
        w.Send(0, 1, 1, 5);
        w.Send(0, 1, 1, 3000);
        w.Send(0, 1, 2, 10, shm::kSendSync);
        w.Send(0, 1, 3, 100000, 0, /*rndv=*/true);
        w.Send(0, 1, 3, 30000, 0, /*rndv=*/true);
      },
      // A claiming probe takes the first rendezvous message.
      [&] { w.Probe(1, 0, 3, 0xc1a1); },
      // Sends matching the posted receives at 2.
      [&] {
        w.Send(1, 2, 7, 100);  // the wildcard takes it (posted first)
        w.Send(0, 2, 7, 100);
        w.Send(0, 2, 9, 2000);
      },
      // Budget: 1 takes 4 unexpected messages more; further sends are held.
      [&] {
        EndpointTestPeer(w.ep(1)).set_unexpected_budget(9 * 128);
        for (int i = 0; i < 10; i++) w.Send(0, 1, 20 + i, 40);
      },
      // A rendezvous to 2, matched, cleared: a transfer mid-stream.
      [&] {
        w.Recv(2, 1, 4, true, 100000);
        w.Send(1, 2, 4, 50000, 0, true);
      },
      [&] {
        transfer = GoOf(w.Reap(1), &go_bytes);
        if (transfer == 0) Die("scenario: no go for the rendezvous");
        w.RndvData(1, transfer, 0, 20000);
      },
      // Completions to 2 that overflow its ring (it does not reap): active
      // messages, up to the hold (kAmOverflowLimit) and beyond.
      [&] {
        for (int round = 0; round < 37; round++) {
          for (int i = 0; i < 30; i++) w.Am(1, 2);
          w.Poll();
        }
      },
      // The claimed message received; 1 drains its unexpected messages.
      [&] {
        w.Reap(1);
        w.Submit(1, shm::PrepClaimedRecv(0xc1a1, 100000));
        for (int i = 0; i < 6; i++) w.Recv(1, 0, 0, false, 4096);
      },
      [&] { stream(w.Reap(0)); },
  };
  for (size_t i = 0; i < steps.size(); i++) {
    steps[i]();
    w.Poll();
    if (static_cast<int>(i) == cut) {
      Status st = w.Handover();
      if (!st.ok()) Die(st.message.c_str());
    }
    if (static_cast<int>(i) == stop_after) return;
  }
  // The end: everything reaped and drained, the budget back, the rest of
  // each stream sent.
  EndpointTestPeer(w.ep(1)).set_unexpected_budget(kBudget);
  for (int round = 0; round < 200; round++) {
    for (uint32_t at = 0; at < kEndpoints; at++) {
      auto cs = w.Reap(at);
      if (at == 0) stream(cs);
    }
    for (int i = 0; i < 8; i++) w.Recv(1, shm::kAnySlot, 0, false, 100000);
    w.Poll();
  }
  if (transfer != 0) {
    w.RndvData(1, transfer, 20000, go_bytes - 20000);
    w.Poll();
  }
  for (uint32_t at = 0; at < kEndpoints; at++) w.Reap(at);
}

}  // namespace psmd::test_world

#endif  // PSMD_DAEMON_ENGINE_TEST_WORLD_H_
