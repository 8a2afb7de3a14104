// libFuzzer target for the loader of the inter-node engine's handover state
// (Remote::LoadState, daemon/remote/remote_handover.cc; docs/design.md,
// "Handover with a fabric"): arbitrary bytes as the fabric engine's section
// of a successor node. The node (node 1) is an MqEngine with one job of
// three endpoints (real segments, a real pool with an inbox region) and a
// Remote over the in-process fabric (hw/loopback_fabric.h) whose sessions
// 1 and 2, to nodes 2 and 3, are the adopted ones; nodes 2 and 3 are bare
// fabrics the target plays. Built and run for a bounded time by
// daemon/remote/remote_state_fuzz.sh, from the seed corpus
// daemon/remote/remote_state_fuzz_corpus/ (states of every part of the
// section, written here in SaveState's layout;
// REMOTE_STATE_FUZZ_WRITE_SEEDS=DIR writes it).
//
// Input: byte 0 says what happens after a load (bit 0: nodes 2 and 3
// answer every converted send with kRndvGo and send a chunk of every
// transfer in that has a receiver; bit 1: node 3's connection is reset;
// bit 2: every endpoint is removed before the Remote goes, else the Remote
// goes first, as in ProgressWorker; bits 3-5: 1-8 rounds of polling, of
// which a frame takes three: header, body, send done); the rest is the
// state.
//
// Checked beyond "no crash, no sanitizer report":
//   1. A refused state changed nothing: the Remote saves what a fresh one
//      does, sent no frame to nodes 2 and 3 and released no pool chunk.
//   2. A loaded state saves a state that loads again into a fresh node and
//      saves as long a state (SaveState after LoadState round-trips).
//   3. A loaded state runs (engine and Remote passes, with kRndvGo answers
//      or a connection reset as byte 0 says), and once the Remote is gone
//      every converted send's pool chunk is released, and no other chunk of
//      the senders' regions; with the endpoints removed first, nothing is
//      charged to the job or the uid.
//   4. A transfer in that its node sent the last bytes of has ended (its
//      receiver got them all).
// At exit it prints how many states loaded, how many of those carried
// converted sends and how many kept payloads, how many converted payloads
// went on a kRndvGo, how many transfers in ended, and how many states were
// refused ("remote_state_fuzz: reached ..."): a run that never loaded a
// converted send has not checked the chunks.
#include <psm2.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "daemon/engine/mq_engine.h"
#include "daemon/engine/other_nodes.h"
#include "daemon/engine/test_endpoint.h"
#include "daemon/handover/handover.h"
#include "daemon/handover/state_codec.h"
#include "daemon/remote/remote.h"
#include "daemon/remote/wire.h"
#include "hw/loopback_fabric.h"
#include "shm/epid.h"
#include "shm/mapping.h"
#include "shm/pool.h"
#include "tests/fuzz_seeds.h"

namespace {

using psmd::Endpoint;
using psmd::Job;
using psmd::JobKey;
using psmd::MqEngine;
using psmd::Remote;
using psmd::Status;
using psmd::handover::StateReader;
using psmd::handover::StateWriter;

constexpr uint16_t kHere = 1;
constexpr uint16_t kNonce = 7;
constexpr uint32_t kEndpoints = 3;  // ids 1..3
// Small: each input's node touches every line of the senders' regions
// (their pages cost most of a refused input's time).
constexpr uint64_t kRegionBytes = 16 << 10;
constexpr uint32_t kRingCapacity = 64;
// The longest chunk of a transfer in the peers send.
constexpr uint32_t kChunkMax = 1024;
const psmd::Uuid kJob{1};
// The job's uid, a constant so that the seeds load whoever runs them (the
// engine matches job keys only; the endpoints are the running user's).
constexpr uint32_t kJobUid = 1000;
// The adopted sessions: connection 1 to node 2, 2 to node 3 (the loopback
// network numbers connections from 1, in the order the target makes them).
const std::map<psmd::hw::ConnId, uint64_t> kSessions = {{1, 2}, {2, 3}};

struct Reached {
  uint64_t loaded = 0, converted = 0, kept = 0, set_aside = 0, parked = 0;
  uint64_t sent = 0, ended = 0, refused = 0;
  ~Reached() {
    printf(
        "remote_state_fuzz: reached loaded=%llu converted=%llu kept=%llu "
        "set_aside=%llu parked=%llu sent=%llu ended=%llu refused=%llu\n",
        static_cast<unsigned long long>(loaded),
        static_cast<unsigned long long>(converted),
        static_cast<unsigned long long>(kept),
        static_cast<unsigned long long>(set_aside),
        static_cast<unsigned long long>(parked),
        static_cast<unsigned long long>(sent),
        static_cast<unsigned long long>(ended),
        static_cast<unsigned long long>(refused));
  }
} reached;

void Check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "remote_state_fuzz: property violated: %s\n", what);
    abort();
  }
}

[[noreturn]] void Die(const char* what) {
  fprintf(stderr, "remote_state_fuzz: %s\n", what);
  abort();
}

uint64_t EpidOf(uint16_t node, uint32_t id) {
  return psmd::shm::MakeEpid(node, kNonce, id);
}

// Node 1, with its two peers' fabrics (the peers themselves are played by
// the target). The Remote goes before the engine, as in ProgressWorker;
// the network outlives every fabric.
class Node {
 public:
  Node() {
    std::unique_ptr<psmd::hw::LoopbackFabric> here = net_.Create(kHere);
    for (uint16_t node = 2; node <= 3; node++) {
      peer_[node - 2] = net_.Create(node);
      psmd::hw::ConnId conn = 0;
      if (peer_[node - 2]->Connect(here->HostDescription(), 0, &conn) !=
              psmd::hw::ErrorClass::kOk ||
          kSessions.at(conn) != node) {
        Die("cannot connect the peers");
      }
    }
    // The sessions are adopted ones: their events went to the old psmd.
    psmd::hw::Event events[8];
    while (here->Poll(events, 8) > 0) {
    }
    for (auto& f : peer_) {
      while (f->Poll(events, 8) > 0) {
      }
    }
    engine_ = std::make_unique<MqEngine>(1 << 30, 1 << 30, 1 << 30);
    std::string error;
    psmd::shm::Mapping pool;
    if (!psmd::shm::Mapping::Create("remote-state-pool",
                                    (kEndpoints + 1) * kRegionBytes, geteuid(),
                                    getegid(), &pool, &error)) {
      Die(error.c_str());
    }
    job_ = std::make_shared<Job>(JobKey{kJob, kJobUid}, std::move(pool),
                                 kEndpoints, kRegionBytes,
                                 std::make_shared<psmd::UidAccount>(),
                                 /*inbox=*/true);
    for (uint32_t id = 1; id <= kEndpoints; id++) {
      auto ep =
          psmd::MakeTestEndpoint(job_, *job_->TakeRegion(), id,
                                 EpidOf(kHere, id), kRingCapacity, 1 << 20);
      endpoints_.push_back(ep);
      engine_->Add(ep);
    }
    // A node table nobody can read: no host names, which nothing here needs.
    remote_ = std::make_unique<Remote>(engine_.get(), std::move(here), kHere,
                                       kNonce, "/nonexistent/psmd-nodes", 5000);
    engine_->AttachRemote(remote_.get());
  }

  ~Node() {
    remote_.reset();
    engine_.reset();
  }

  Remote& remote() { return *remote_; }
  Job& job() { return *job_; }
  psmd::hw::LoopbackFabric& peer(uint16_t node) { return *peer_[node - 2]; }

  std::string Save() const {
    StateWriter w;
    remote_->SaveState(w);
    return w.Take();
  }
  Status Load(const std::string& state) {
    StateReader r(state.data(), state.size());
    return remote_->LoadState(r, kSessions);
  }

  void Poll() {
    engine_->PollAll();
    remote_->Poll();
  }
  // As their clients closing; the Remote hears of each (EndpointRemoved).
  void RemoveEndpoints() {
    for (auto& ep : endpoints_) engine_->Remove(ep->id());
    endpoints_.clear();
    engine_->PollAll();
    if (remote_) remote_->Poll();
  }
  void DropRemote() {
    engine_->AttachRemote(nullptr);
    remote_.reset();
  }

  // The chunk header of each cache line of the senders' regions (the
  // endpoints' regions come first in the pool).
  std::atomic<uint32_t>& LineState(uint64_t line) {
    return reinterpret_cast<psmd::shm::ChunkHeader*>(
               job_->pool().base() + line * psmd::shm::kCacheLine)
        ->state;
  }
  static constexpr uint64_t kSenderLines =
      kEndpoints * kRegionBytes / psmd::shm::kCacheLine;

 private:
  psmd::hw::LoopbackNetwork net_;
  std::unique_ptr<psmd::hw::LoopbackFabric> peer_[2];
  std::unique_ptr<MqEngine> engine_;
  std::shared_ptr<Job> job_;
  std::vector<std::shared_ptr<Endpoint>> endpoints_;
  std::unique_ptr<Remote> remote_;
};

// A rendezvous transfer in as SaveState wrote it.
struct TransferIn {
  uint64_t id = 0;
  uint16_t node = 0;
  uint32_t receiver = 0;
  uint64_t src = 0;
  uint32_t send_bytes = 0;
  uint32_t accepted = 0;
};

// A converted send as SaveState wrote it.
struct ConvertedSend {
  uint64_t id = 0;
  uint16_t node = 0;
  uint32_t sender = 0;
  uint64_t dst = 0;
  uint64_t offset = 0;
  uint32_t len = 0;
};

// The transfers in and converted sends of a state SaveState wrote (read as
// LoadState does, up to them).
struct Carried {
  std::vector<TransferIn> in;
  std::vector<ConvertedSend> converted;
  uint32_t kept = 0;                       // payloads kept, and kept chunks
  uint32_t set_aside = 0;                  // frames set aside
  std::vector<uint64_t> set_aside_chunks;  // their pool chunks' offsets
  uint32_t parked = 0;                     // frames parked, kGones too
};
Carried CarriedOf(const std::string& state) {
  StateReader r(state.data(), state.size());
  Carried out;
  uint32_t n = 0, k = 0;
  uint64_t u64 = 0;
  uint32_t u32 = 0;
  uint16_t u16 = 0;
  bool b = false;
  auto fail = [] { Die("a saved state does not read back"); };
  if (!r.Count(&n, 1, 1u << 20, "peers")) fail();
  for (uint32_t i = 0; i < n; i++) {
    if (!r.U16(&u16, "") || !r.U64(&u64, "") || !r.Count(&k, 1, 1u << 20, ""))
      fail();
    for (uint32_t j = 0; j < k; j++) {
      if (!r.U32(&u32, "") || !r.U64(&u64, "")) fail();
    }
    for (int set = 0; set < 2; set++) {
      if (!r.Count(&k, 1, 1u << 20, "")) fail();
      for (uint32_t j = 0; j < k; j++) {
        if (!r.U64(&u64, "")) fail();
      }
    }
    for (int map = 0; map < 2; map++) {
      if (!r.Count(&k, 1, 1u << 20, "")) fail();
      for (uint32_t j = 0; j < k; j++) {
        if (!r.U64(&u64, "") || !r.U64(&u64, "")) fail();
      }
    }
    std::string bytes;
    uint8_t job[16];
    if (!r.Count(&k, 1, 1u << 20, "")) fail();  // kept payloads
    out.kept += k;
    for (uint32_t j = 0; j < k; j++) {
      if (!r.U32(&u32, "") || !r.U32(&u32, "") || !r.U64(&u64, "") ||
          !r.U64(&u64, "") || !r.Pod(&job, "") || !r.Bool(&b, "") ||
          !r.Str(&bytes, 1u << 30, ""))
        fail();
    }
    if (!r.Count(&k, 1, 1u << 20, "")) fail();  // kept chunks
    out.kept += k;
    for (uint32_t j = 0; j < k; j++) {
      if (!r.U64(&u64, "") || !r.Str(&bytes, 1u << 30, "")) fail();
    }
    uint32_t lists = 0;  // frames set aside, by receiver, then kGones
    if (!r.Count(&lists, 1, 1u << 20, "")) fail();
    for (uint32_t j = 0; j <= lists; j++) {
      if ((j < lists && !r.U64(&u64, "")) || !r.Count(&k, 1, 1u << 20, ""))
        fail();
      out.set_aside += k;
      for (uint32_t m = 0; m < k; m++) {
        psmd::hw::FrameFields f;
        if (!r.Pod(&f, "")) fail();
        if (psmd::wire::TraitsOf(f.op).shape == psmd::wire::Shape::kEnvelope) {
          if (!r.Str(&bytes, 1u << 30, "")) fail();
        } else {
          if (!r.U64(&u64, "") || !r.U32(&u32, "")) fail();
          out.set_aside_chunks.push_back(u64);
        }
      }
    }
    if (!r.Count(&lists, 1, 1u << 20, "")) fail();  // parked, by receiver
    for (uint32_t j = 0; j < lists; j++) {
      if (!r.U64(&u64, "") || !r.Count(&k, 1, 1u << 20, "")) fail();
      out.parked += k;
      for (uint32_t m = 0; m < k; m++) {
        psmd::hw::FrameFields f;
        if (!r.Bool(&b, "") || !r.Pod(&f, "") ||
            (!b && !r.Str(&bytes, 1u << 30, "")) ||
            !r.Str(&bytes, 1u << 30, "") || !r.Bool(&b, ""))
          fail();
        if (b && (!r.U32(&u32, "") || !r.U64(&u64, "") || !r.U32(&u32, "") ||
                  !r.U64(&u64, "") || !r.U64(&u64, "")))
          fail();
      }
    }
    if (!r.Count(&k, 1, 1u << 20, "")) fail();  // parked kGones
    out.parked += k;
    for (uint32_t j = 0; j < k; j++) {
      psmd::hw::FrameFields f;
      if (!r.Pod(&f, "") || !r.Str(&bytes, 1u << 30, "")) fail();
    }
  }
  if (!r.U32(&u32, "") || !r.U64(&u64, "") || !r.Count(&n, 1, 1u << 20, ""))
    fail();
  for (uint32_t i = 0; i < n; i++) {
    TransferIn t;
    if (!r.U64(&t.id, "") || !r.U16(&t.node, "") || !r.U32(&t.receiver, "") ||
        !r.U64(&u64, "") || !r.U64(&t.src, "") || !r.U32(&t.send_bytes, "") ||
        !r.U32(&u32, "") || !r.U64(&u64, "") || !r.U32(&t.accepted, ""))
      fail();
    out.in.push_back(t);
  }
  if (!r.Count(&n, 1, 1u << 20, "")) fail();
  for (uint32_t i = 0; i < n; i++) {
    psmd::wire::Sender from;
    if (!r.U64(&u64, "") || !r.U16(&u16, "") || !r.U32(&u32, "") ||
        !r.U64(&u64, "") || !r.U64(&u64, "") || !r.U32(&u32, "") ||
        !r.U32(&u32, "") || !r.Bool(&b, "") || !r.U64(&u64, "") ||
        !r.Pod(&from, ""))
      fail();
  }
  if (!r.U64(&u64, "") || !r.Count(&n, 1, 1u << 20, "")) fail();
  for (uint32_t i = 0; i < n; i++) {
    ConvertedSend c;
    if (!r.U64(&c.id, "") || !r.U16(&c.node, "") || !r.U32(&c.sender, "") ||
        !r.U64(&u64, "") || !r.Bool(&b, "") || !r.U64(&c.dst, "") ||
        !r.U64(&c.offset, "") || !r.U32(&c.len, ""))
      fail();
    out.converted.push_back(c);
  }
  return out;
}

// Node `c.node` answers converted send `c` with a kRndvGo for all of it (as
// its daemon does once the receive matched).
void SendGo(Node& n, const ConvertedSend& c, uint64_t transfer) {
  psmd::wire::Sender receiver;
  receiver.epid = c.dst;
  receiver.uid = geteuid();
  std::memcpy(receiver.job, kJob.data(), sizeof(receiver.job));
  const psmd::wire::Envelope go = psmd::wire::PrepRndvGo(
      receiver, EpidOf(kHere, c.sender), c.id, c.len, transfer);
  uint8_t bytes[psmd::wire::kEnvelopeMax];
  iovec iov = {bytes, psmd::wire::Encode(go, bytes)};
  const psmd::hw::ConnId conn = c.node == 2 ? 1 : 2;
  (void)n.peer(c.node).PostSend(conn, go.f, &iov, 1, transfer);
}

// Node `t.node` sends the next chunk (up to kChunkMax) of transfer in `t`,
// to its receiver.
bool SendChunk(Node& n, const TransferIn& t) {
  if (t.receiver == 0 || t.accepted == t.send_bytes) return false;
  psmd::wire::Sender sender;
  sender.epid = t.src;
  sender.uid = geteuid();
  std::memcpy(sender.job, kJob.data(), sizeof(sender.job));
  const psmd::hw::FrameFields f = psmd::wire::PrepRndvData(
      sender, EpidOf(kHere, t.receiver), t.id, t.accepted);
  std::vector<uint8_t> bytes(std::min(t.send_bytes - t.accepted, kChunkMax),
                             'r');
  iovec iov = {bytes.data(), bytes.size()};
  const psmd::hw::ConnId conn = t.node == 2 ? 1 : 2;
  (void)n.peer(t.node).PostSend(conn, f, &iov, 1, 0);
  return true;
}

// ---- seeds: states in SaveState's layout (remote_handover.cc) ----

struct Parts {
  bool peers = false, in = false, out = false, converted = false;
  bool watchers = false, proxies = false, inbox = false, kept = false;
  bool set_aside = false;
  bool parked = false;
};

// Endpoint `id` of `node` as a frame's sender.
psmd::wire::Sender SenderAt(uint16_t node, uint32_t id) {
  psmd::wire::Sender s;
  std::memset(&s, 0, sizeof(s));  // its padding too: seeds are stable
  s.epid = EpidOf(node, id);
  s.uid = kJobUid;
  std::memcpy(s.job, kJob.data(), sizeof(s.job));
  return s;
}
psmd::wire::Sender SenderHere(uint32_t id) { return SenderAt(kHere, id); }

// A frame set aside as SaveState writes it: an envelope, or a data frame
// sending `len` bytes of the pool chunk at `offset`.
void WriteSetAside(StateWriter& w, const psmd::wire::Envelope& e) {
  w.Pod(e.f);
  uint8_t bytes[psmd::wire::kEnvelopeMax];
  const uint32_t len = psmd::wire::Encode(e, bytes);
  w.Str(std::string(reinterpret_cast<const char*>(bytes), len));
}
void WriteSetAside(StateWriter& w, const psmd::hw::FrameFields& f,
                   uint64_t offset, uint32_t len) {
  w.Pod(f);
  w.U64(offset);
  w.U32(len);
}

std::string StateOf(const Parts& p) {
  StateWriter w;
  // Peers: node 2 on session 1, node 3 on session 2.
  w.U32(p.peers ? 2 : 0);
  for (uint16_t node = 2; p.peers && node <= 3; node++) {
    w.U16(node);
    w.U64(node - 1);
    w.U32(2);  // awaiting: (endpoint, request)
    w.U32(1);
    w.U64(100 + node);
    w.U32(2);
    w.U64(200 + node);
    w.U32(1);  // off
    w.U64(EpidOf(node, 1));
    w.U32(2);  // eager off
    w.U64(EpidOf(node, 1));
    w.U64(EpidOf(node, 2));
    w.U32(1);  // unconsumed: that node's receivers
    w.U64(EpidOf(node, 2));
    w.U64(4096);
    w.U32(1);  // consumed: ours
    w.U64(EpidOf(kHere, node - 1));
    w.U64(1000);
    // Payloads kept here for unexpected messages from node 2, one of them
    // waiting for a receive; with transfers in, one matched, its bytes
    // waiting for inbox room (transfer 5).
    const bool kept = p.kept && node == 2;
    w.U32(kept ? 2 : 0);
    for (uint32_t i = 0; kept && i < 2; i++) {
      w.U32(1 + i);
      w.U32(kJobUid);
      w.U64(EpidOf(node, 1 + i));
      w.U64(EpidOf(kHere, 1 + i));
      w.Pod(kJob);
      w.Bool(i == 0);
      w.Str(std::string(2000 + 1000 * i, 'k'));
    }
    w.U32(kept && p.in ? 1 : 0);
    if (kept && p.in) {
      w.U64(5);
      w.Str(std::string(3000, 'c'));
    }
    // Frames set aside for node 2's endpoint 1, which is off: an inline
    // message, an eager one's envelope and its payload (a chunk of sender
    // 1's region), a transfer's abort; and a kGone behind them.
    const bool aside = p.set_aside && node == 2;
    w.U32(aside ? 1 : 0);
    if (aside) {
      const uint64_t dst = EpidOf(node, 1);
      const uint8_t inline_bytes[8] = {1, 2, 3, 4, 5, 6, 7, 8};
      const uint32_t tag[3] = {5, 0, 0};
      w.U64(dst);
      w.U32(4);
      WriteSetAside(w, psmd::wire::PrepMessage(SenderHere(1), dst, 400, tag, 8,
                                               0, false, inline_bytes));
      WriteSetAside(w, psmd::wire::PrepMessage(SenderHere(1), dst, 401, tag,
                                               600, 0, false, nullptr));
      WriteSetAside(w, psmd::wire::PrepPayload(SenderHere(1), dst, 401),
                    psmd::shm::kCacheLine * 21, 600);
      WriteSetAside(w, psmd::wire::PrepAbort(SenderHere(2), dst, 9,
                                             PSM2_EPID_UNREACHABLE));
    }
    w.U32(aside ? 1 : 0);
    if (aside) WriteSetAside(w, psmd::wire::PrepGone(SenderHere(3), 0));
    // Frames parked here from node 2 for endpoint 1: an inline message, an
    // eager one with its payload and the receive it took, an active-message
    // request; with transfers in, the next chunk of transfer 1; and a kGone
    // of the inline message's sender, behind them.
    const bool parked = p.parked && node == 2;
    w.U32(parked ? 1 : 0);
    if (parked) {
      const uint64_t dst = EpidOf(kHere, 1);
      const uint8_t inline_bytes[8] = {8, 7, 6, 5, 4, 3, 2, 1};
      const uint32_t tag[3] = {6, 0, 0};
      w.U64(dst);
      w.U32(p.in ? 4 : 3);
      auto envelope = [&](const psmd::wire::Envelope& e, uint32_t payload) {
        w.Bool(false);
        WriteSetAside(w, e);
        w.Str(std::string(payload, 'p'));
      };
      envelope(psmd::wire::PrepMessage(SenderAt(node, 1), dst, 500, tag, 8, 0,
                                       false, inline_bytes),
               0);
      w.Bool(false);
      envelope(psmd::wire::PrepMessage(SenderAt(node, 2), dst, 501, tag, 700, 0,
                                       false, nullptr),
               700);
      w.Bool(true);  // the receive it took
      w.U32(1);
      w.U64(77);
      w.U32(4096);
      w.U64(psmd::kAnySource);
      w.U64(0);
      envelope(psmd::wire::PrepActiveMessage(false, SenderAt(node, 2), dst, 502,
                                             3, 1, 8, 0, inline_bytes),
               0);
      w.Bool(false);
      if (p.in) {
        w.Bool(true);
        w.Pod(psmd::wire::PrepRndvData(SenderAt(node, 3), dst, 1, 1000));
        w.Str(std::string(300, 'd'));
        w.Bool(false);
      }
    }
    w.U32(parked ? 1 : 0);
    if (parked) WriteSetAside(w, psmd::wire::PrepGone(SenderAt(node, 1), 0));
  }
  w.U32(p.kept ? 3 : 1);  // next kept id
  const bool kept_chunk = p.kept && p.in;
  w.U64(kept_chunk ? 7 : p.in ? 5 : 1);  // next transfer in
  w.U32(kept_chunk ? 3 : p.in ? 2 : 0);
  for (uint32_t i = 0; p.in && i < 2; i++) {
    w.U64(1 + 2 * i);
    w.U16(2 + i);
    w.U32(i == 0 ? 1 : 0);  // the second one's receiver left
    w.U64(7 + i);
    w.U64(EpidOf(2 + i, 3));
    // The first ends with the next chunk.
    w.U32(i == 0 ? 1000 + kChunkMax : 100000);
    w.U32(1000);  // received
    w.U64(9 + i);
    // accepted: with frames parked, the first's next 300 bytes too
    w.U32(i == 0 && p.parked ? 1300 : 1000);
  }
  if (kept_chunk) {  // all accepted, in the kept chunk; none delivered
    w.U64(5);
    w.U16(2);
    w.U32(2);
    w.U64(11);
    w.U64(EpidOf(2, 2));
    w.U32(3000);
    w.U32(0);
    w.U64(12);
    w.U32(3000);
  }
  w.U32(p.out ? 2 : 0);
  for (uint32_t i = 0; p.out && i < 2; i++) {
    w.U64(3 + i);
    w.U16(3 - i);
    w.U32(2 + i);
    w.U64(EpidOf(3 - i, 1));
    w.U64(77 + i);
    w.U32(50000);
    w.U32(1000 * i);
    w.Bool(i == 1);  // dead
    w.U64(8 + i);
    psmd::wire::Sender from;
    std::memset(&from, 0, sizeof(from));  // its padding too: seeds are stable
    from.epid = EpidOf(kHere, 2 + i);
    from.uid = kJobUid;
    std::memcpy(from.job, kJob.data(), sizeof(from.job));
    w.Pod(from);
  }
  w.U64(p.converted ? 4 : 1);  // next converted
  w.U32(p.converted ? 3 : 0);
  for (uint32_t i = 0; p.converted && i < 3; i++) {
    const uint32_t sender = 1 + i;
    w.U64(psmd::wire::kConvertedBit | (1 + i));
    w.U16(2 + i % 2);
    w.U32(sender);
    w.U64(300 + i);
    w.Bool(i == 0);  // sync: its request waits for the answer
    w.U64(EpidOf(2 + i % 2, 1 + i));
    // A chunk of the sender's region, as its arena placed it.
    w.U64((sender - 1) * kRegionBytes + psmd::shm::kCacheLine * (1 + 4 * i));
    w.U32(100 + 1000 * i);
  }
  w.U32(p.watchers ? 2 : 0);
  if (p.watchers) {
    w.U32(1);
    w.U32(2);
    w.U16(2);
    w.U16(3);
    w.U32(3);
    w.U32(1);
    w.U16(2);
  }
  // Proxies: the next id and (epid, id) pairs.
  w.U32(psmd::kProxyBase + (p.proxies ? 2 : 0));
  w.U32(p.proxies ? 2 : 0);
  for (uint32_t i = 0; p.proxies && i < 2; i++) {
    w.U64(EpidOf(2 + i, 1));
    w.U32(psmd::kProxyBase + i);
  }
  w.U32(p.inbox ? 1 : 0);
  if (p.inbox) {
    w.Pod(kJob);
    w.U32(kJobUid);
    // Two chunks in the ring, one set aside past them.
    psmd::shm::SendArena::State s;
    s.tail = 128;
    s.head = 128 + 256 + 64;
    s.ring = {{0, 256, false, true}, {0, 64, false, false}};
    s.set_aside = {{4096, 128, false, true}};
    psmd::handover::WriteArenaState(w, s);
  }
  return w.Take();
}

std::vector<std::string> Seeds() {
  std::vector<Parts> parts(11);
  parts[1].peers = true;
  parts[2].peers = parts[2].in = true;
  parts[3].peers = parts[3].out = true;
  parts[4].peers = parts[4].converted = true;
  parts[5].peers = parts[5].watchers = true;
  parts[6].proxies = true;
  parts[7].inbox = true;
  parts[8] = {true, true, true, true, true, true, true, true};
  parts[9].peers = parts[9].kept = true;
  parts[10].peers = parts[10].kept = parts[10].in = true;
  parts.emplace_back();
  parts.back().peers = parts.back().set_aside = true;
  parts[8].set_aside = true;
  parts.emplace_back();
  parts.back().peers = parts.back().parked = true;
  parts.emplace_back();
  parts.back().peers = parts.back().parked = parts.back().in = true;
  parts[8].parked = true;
  std::vector<std::string> seeds;
  for (const Parts& p : parts) {
    const std::string state = StateOf(p);
    Node n;
    if (!n.Load(state).ok()) Die("a seed does not load");
    // With every way of running it after the load.
    for (char mode : {'\x00', '\x1d', '\x23', '\x16', '\x39'}) {
      seeds.push_back(mode + state);
    }
  }
  return seeds;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  psmd::fuzz::WriteSeedsIfAsked("REMOTE_STATE_FUZZ_WRITE_SEEDS",
                                "remote_state_fuzz", Seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool go = data[0] & 1;
  const bool sever = data[0] & 2;
  const bool remove_first = data[0] & 4;
  const uint32_t rounds = 1 + ((data[0] >> 3) & 7);
  const std::string state(reinterpret_cast<const char*>(data + 1), size - 1);
  Node n;
  // Every line of the senders' regions in use, as if chunks were there:
  // what the Remote releases shows.
  for (uint64_t line = 0; line < Node::kSenderLines; line++) {
    n.LineState(line).store(psmd::shm::kChunkInUse);
  }
  const std::string fresh = n.Save();
  const Status st = n.Load(state);
  if (!st.ok()) {
    reached.refused++;
    // Property 1.
    Check(!st.message.empty(), "a refusal says nothing");
    Check(n.Save() == fresh, "a refused state changed the Remote");
    Check(n.peer(2).frames_waiting() == 0 && n.peer(3).frames_waiting() == 0,
          "a refused state sent frames");
    for (uint64_t line = 0; line < Node::kSenderLines; line++) {
      Check(n.LineState(line).load() == psmd::shm::kChunkInUse,
            "a refused state released a chunk");
    }
    return 0;
  }
  reached.loaded++;
  // Property 2.
  const std::string saved = n.Save();
  {
    Node next;
    const Status again = next.Load(saved);
    Check(again.ok(), "a loaded state saved does not load again");
    Check(next.Save().size() == saved.size(),
          "a loaded state saved, loaded and saved again differs");
  }
  // Property 3 (and 4, below).
  const Carried carried = CarriedOf(saved);
  const std::vector<ConvertedSend>& converted = carried.converted;
  if (!converted.empty()) reached.converted++;
  if (carried.kept != 0) reached.kept++;
  if (carried.set_aside != 0) reached.set_aside++;
  if (carried.parked != 0) reached.parked++;
  std::set<uint64_t> held;  // the lines of their chunks' headers
  for (const ConvertedSend& c : converted) {
    held.insert((c.offset - psmd::shm::kChunkHeaderBytes) /
                psmd::shm::kCacheLine);
  }
  for (uint64_t offset : carried.set_aside_chunks) {
    held.insert((offset - psmd::shm::kChunkHeaderBytes) /
                psmd::shm::kCacheLine);
  }
  uint32_t frames[4] = {};  // sent by node 2 and 3
  if (go) {
    uint64_t transfer = 1;
    for (const ConvertedSend& c : converted) {
      SendGo(n, c, transfer++);
      frames[c.node]++;
    }
    for (const TransferIn& t : carried.in) frames[t.node] += SendChunk(n, t);
  }
  if (sever) n.peer(3).Sever(kHere);
  for (uint32_t round = 0; round < rounds; round++) n.Poll();
  // Property 4: a transfer in whose last bytes came has ended, if they had
  // the time (each frame its node sent takes two rounds: header, body) and
  // the room (the inbox, whose headers all read released, has it for 8
  // chunks).
  if (go && !sever && frames[2] + frames[3] <= 8) {
    std::set<uint64_t> open;
    for (const TransferIn& t : CarriedOf(n.Save()).in) open.insert(t.id);
    for (const TransferIn& t : carried.in) {
      if (t.receiver == 0 || t.send_bytes - t.accepted > kChunkMax ||
          rounds < 2 * frames[t.node])
        continue;
      Check(open.count(t.id) == 0,
            "a transfer in that got its last bytes did not end");
      reached.ended++;
    }
  }
  if (go && !sever) {
    for (uint64_t line : held) {
      if (n.LineState(line).load() == psmd::shm::kChunkReleased) reached.sent++;
    }
  }
  if (remove_first) n.RemoveEndpoints();
  n.DropRemote();
  for (uint64_t line = 0; line < Node::kSenderLines; line++) {
    const bool released = n.LineState(line).load() == psmd::shm::kChunkReleased;
    Check(released == (held.count(line) != 0),
          held.count(line) != 0
              ? "a carried chunk (a converted send's, a frame's set aside) "
                "outlived the Remote"
              : "a chunk nothing carried held was released");
  }
  if (remove_first) {
    Check(n.job().unexpected_cost.load() == 0 &&
              n.job().account().unexpected_cost.load() == 0 &&
              n.job().posted_recvs.load() == 0 &&
              n.job().account().posted_recvs.load() == 0,
          "budgets still charged once every endpoint left");
  }
  return 0;
}
