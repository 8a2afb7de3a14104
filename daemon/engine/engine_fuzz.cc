// libFuzzer target for the descriptor validator and the engine's dispatch
// (daemon/engine/engine_fuzz.sh runs it; //daemon/engine:engine_fuzz_test in
// CI).
//
// Each input is a program for a small node: two jobs of one uid (job A with
// three endpoint positions, job B with one) on real memfd segments and pools,
// an MqEngine driven by hand, and the harness playing every client. Every
// input runs twice: on one engine, and on two engine shards joined by a
// Crossing (mq_engine.h, invariant 11), endpoints placed by id as psmd
// places them, so that job A's endpoints talk across shards; a turn turns
// both shards. Beside them sits a stand-in for the fabric to other nodes
// (FakeFabric: an OtherNodes on the only engine, or on shard 0 with the
// other shards routed to it, as psmd runs it: mq_engine.h invariant 12):
// frames from another node reach endpoints as the Remote hands them over
// (Arrive or Post on shard 0, ArriveAcross and AmArriveAcross for another
// shard's, held back when those say so), links name an endpoint on that
// node, whose endpoints and whole node can be lost. The
// input's bytes are read front to back as operations: a raw 64-byte
// descriptor on either ring, well-formed descriptors from the shm::Prep*
// builders with fuzzed fields (sometimes on the wrong ring), bytes scribbled
// into a job pool, engine turns, client reaps (which release the chunks the
// completions carry, as a client does), and removing and re-adding
// endpoints. At the end every endpoint is removed.
//
// Copies in place (mq_engine.h, invariant 10; copies within one shard and
// across shards): the input's first op may turn them on (kCopyInPlace:
// copy_after 0, 1, 10 or 200 ms, a threshold of 1 B or 64 KiB), and the
// engines' copy clock is the harness's (MqEngine::SetCopyClock), which moves
// only at kAdvance: a transfer is taken over at the same step on every run of
// an input. Every endpoint's pidfd names this process, and the buffers a
// rendezvous send and receive name are memory of this process (one mapping
// with an inaccessible page behind it), so the copier's process_vm_readv
// and process_vm_writev really move the bytes; a raw descriptor's buffer
// address is moved into a scratch mapping of its own (a copy past it fails
// with EFAULT, as a client's bad range does). The copy itself runs on the
// copier's thread, so its end is seen at whichever pass comes after it,
// unless the input waits for it (kAdvance with its settle bit, a
// handover): only then is where it ends fixed.
//
// Checked beyond "no crash, no sanitizer report":
//   1. Every completion an endpoint reaps belongs to its own job: its token
//      carries the job's tag (the harness tags every submission's token,
//      also raw ones) and its source epid, if any, is of the same job. A
//      completion's payload chunk lies inside the job's pool.
//   2. Once every endpoint is removed, every pool chunk the harness handed
//      over in a valid submission is released (mq_engine.h, Remove: payloads
//      of dropped messages and of unread completions go back to their
//      senders; a rejected submission's chunk stays the client's, as in
//      client/endpoint.cc). Skipped for a job whose pool was scribbled on,
//      since a scribble may have rewritten chunk headers.
//   3. Once every endpoint is removed, nothing is charged to any job's or
//      the uid's unexpected budget.
//   4. A handover (issue 33; mq_engine.h, "Handover to a successor
//      process") at any point the input picks: every shard quiesces (the
//      rings are not read meanwhile; a copy in place still running is
//      waited for, as the protocol says a quiesced engine runs none), saves
//      its state, and is destroyed with its endpoints and job objects
//      (their pidfds, which the successor's registry takes again, as the
//      harness does); fresh ones are made over the
//      same segments and pools (the clients keep their own mappings, as
//      processes do) and load the states, which must load, and credits
//      must agree across shards. Properties 1-3 then hold for the whole
//      run, so nothing was lost, duplicated or left charged across it.
//   5. Rendezvous messages the harness sends carry their id in their first
//      8 bytes and a pattern after it; receives it posts with a buffer
//      (named for copies in place or not) get their streamed chunks copied
//      in as the library does. Every byte of such a receive arrives once
//      (streamed or placed by psmd, no range twice), the bytes are the
//      message's, sent by the epid the receive was told, and one sender's
//      messages of one tag reach one receiver in the order sent. A receive
//      or send gets no completion after the one that ended it (and a
//      receive one kRecvRndv, a send one go). Skipped for the content of a
//      job whose rendezvous traffic the harness cannot know (raw
//      rendezvous descriptors, chunks for a transfer it made up, a send it
//      had no client memory left for, a scribbled pool). Eager messages of
//      8 B or more carry their id and pattern too (inline or in the pool):
//      each reaches a receive or a claiming probe at most once, intact,
//      from its sender, and one sender's messages of one tag reach one
//      receiver's receives in the order sent (skipped for a job that sent
//      raw descriptors or whose pool was scribbled on, and for frames from
//      another node).
//   6. At the end every shard quiesces: no copy running, nothing in flight
//      between shards. Before it, once copy_after passed, every send that
//      awaits kSendDone (kGoAwaitDone) gets it or an error: psmd takes
//      every stalled transfer over and ends it. (Not after a handover, whose
//      successor streams a transfer between shards to its end, nor with
//      the fabric, which Quiesce leaves alone.)
//
// Seeds: ENGINE_FUZZ_WRITE_SEEDS=DIR ./engine_fuzz writes the seed corpus
// (well-formed sequences built with the Encoder below) into DIR and exits.
#include <psm2.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "daemon/clock.h"
#include "daemon/engine/mq_engine.h"
#include "daemon/engine/test_endpoint.h"
#include "daemon/engine/validate.h"
#include "daemon/handover/state_codec.h"
#include "shm/epid.h"
#include "shm/payload.h"
#include "shm/pool.h"
#include "shm/segment.h"

namespace psmd {
namespace {

constexpr uint32_t kRingCapacity = 16;  // small: overflow and holds happen
constexpr uint64_t kRegionBytes = 64 << 10;
constexpr uint32_t kLivesPerPosition = 3;  // regions are never recycled
constexpr uint32_t kMaxLen = 200000;       // rendezvous lengths up to this
// The clients' memory for rendezvous buffers (a run stops naming buffers
// once it is used up), and the scratch that raw descriptors' name.
constexpr size_t kClientBytes = size_t{4} << 20;
constexpr size_t kScratchBytes = size_t{256} << 10;
// Tokens of the sends and receives property 5 follows (a message's id or
// a receive's, below): no fuzzed token reaches this bit.
constexpr uint64_t kTracked = uint64_t{1} << 48;
constexpr uint64_t kClockStart = 1'000'000'000;

// Operations (one byte each, modulo kOpCount).
enum Op : uint8_t {
  kRaw,
  kSend,
  kRndvSend,
  kRecv,
  kProbe,
  kClaimedRecv,
  kCancel,
  kRndvData,
  kSetOption,
  kAmRequest,
  kAmReply,
  kAmAck,
  kScribble,
  kTurn,
  kReap,
  kRemove,
  kReAdd,
  kDisconnect,  // psm2_ep_disconnect of one slot (Registry::Disconnect)
  kReconnect,
  // Between nodes (FakeFabric).
  kFrame,       // a message or active message from another node arrives
  kRemoteLink,  // a slot names the endpoint on another node
  kNodeEvent,   // that endpoint, or its whole node, is gone
  kFabricHold,  // the fabric holds sends to other nodes, or not
  kHandover,    // every engine quiesced, saved, and loaded into fresh ones
  // Copies in place.
  kCopyInPlace,  // the engines take stalled transfers over from now on
  kAdvance,      // the copy clock moves on; and maybe copies are waited for
  kOpCount
};

// The one endpoint on another node, of every job (so its epid counts as
// the job's in property 1).
constexpr uint64_t kRemoteEpid = shm::MakeEpid(9, 1, 77);

[[noreturn]] void Fail(const char* what) {
  fprintf(stderr, "engine_fuzz: property violated: %s\n", what);
  abort();
}

// The copy clock of every engine (MqEngine::SetCopyClock): time passes for
// copies in place only where the input says (kAdvance).
uint64_t fake_now_ns = kClockStart;
uint64_t FakeNow() { return fake_now_ns; }

// Memory of the client processes (this one: every endpoint's pidfd names
// it) for the buffers a copy in place reads or writes, with an
// inaccessible page behind it: a copy past its end fails (EFAULT) instead
// of writing over the harness. Handed out once per run, never reused, so
// that a copy still running can only write where its receive said.
class ClientMemory {
 public:
  explicit ClientMemory(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes + kGuard, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED ||
        mprotect(static_cast<uint8_t*>(p) + bytes, kGuard, PROT_NONE) != 0) {
      perror("client memory");
      abort();
    }
    base_ = static_cast<uint8_t*>(p);
  }
  ~ClientMemory() { munmap(base_, bytes_ + kGuard); }
  ClientMemory(const ClientMemory&) = delete;
  ClientMemory& operator=(const ClientMemory&) = delete;
  // `n` fresh bytes, or null once used up.
  uint8_t* Take(size_t n) {
    n = (n + shm::kCacheLine) & ~(size_t{shm::kCacheLine} - 1);
    if (n > bytes_ - used_) return nullptr;
    uint8_t* p = base_ + used_;
    used_ += n;
    return p;
  }
  // An address inside, from any 64-bit value (a raw descriptor's).
  uint64_t Within(uint64_t raw) const {
    return reinterpret_cast<uintptr_t>(base_) + raw % bytes_;
  }

 private:
  static constexpr size_t kGuard = 4096;
  const size_t bytes_;
  uint8_t* base_ = nullptr;
  size_t used_ = 0;
};

// The bytes of tracked rendezvous message `id` after its first 8 (the
// id): a window of one pattern, where it starts depending on the id, in
// which no shift below 16 MiB repeats, so a chunk shifted, repeated or of
// another message shows. Written and compared with memcpy and memcmp
// (byte loops under the sanitizers cost the CI run more than its budget).
constexpr uint32_t kPatternStarts = 1 << 16;
const uint8_t* MessageBytes(uint64_t id) {
  static const std::vector<uint8_t> pattern = [] {
    std::vector<uint8_t> p(kMaxLen + kPatternStarts);
    for (uint32_t k = 0; k < p.size(); k++)
      p[k] = static_cast<uint8_t>(k * 7 + (k >> 8) * 13 + (k >> 16) * 29);
    return p;
  }();
  return pattern.data() + (id * 257) % kPatternStarts;
}
constexpr uint64_t kIdMark = uint64_t{0x5053} << 48;  // "PS": an id follows

void FillMessage(uint8_t* p, uint64_t id, uint32_t len) {
  const uint64_t head = kIdMark | id;
  std::memcpy(p, &head, len < 8 ? len : 8);
  if (len > 8) std::memcpy(p + 8, MessageBytes(id) + 8, len - 8);
}

// Reads the input front to back; past its end every read is zero.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool done() const { return n_ == 0; }
  uint8_t U8() {
    if (n_ == 0) return 0;
    n_--;
    return *p_++;
  }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  uint32_t U32() { return U16() | (uint32_t{U16()} << 16); }
  uint64_t U64() { return U32() | (uint64_t{U32()} << 32); }
  // A value in [lo, hi] from two bytes.
  uint32_t Range(uint32_t lo, uint32_t hi) {
    return lo + static_cast<uint32_t>(U16() % (uint64_t{hi} - lo + 1));
  }
  bool Bool() { return U8() & 1; }
  void Bytes(void* out, size_t k) {
    auto* o = static_cast<uint8_t*>(out);
    for (size_t i = 0; i < k; i++) o[i] = U8();
  }
  // A message length: inline sizes often, pool and rendezvous sizes too.
  uint32_t Len(uint32_t max) {
    uint8_t kind = U8();
    if (kind < 128) return kind % (shm::kInlineMax + 1);
    if (kind < 224) return Range(0, 9000 < max ? 9000 : max);
    return U32() % (max + 1);
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

struct JobState {
  std::shared_ptr<Job> job;    // the engines' (a new one per handover)
  std::shared_ptr<Job> first;  // the clients' mapping of the pool (arenas)
  uint32_t regions_taken = 0;
  shm::SendArena inbox;  // where frames from another node land
  uint8_t tag;           // top byte of every token of this job
  std::vector<uint32_t> positions;
  std::set<uint64_t> epids;    // every epid the job ever had
  std::set<uint64_t> tracked;  // chunks handed over in valid submissions
  bool scribbled = false;
  // Rendezvous bytes the harness did not write may reach its receives
  // (property 5 skips their content).
  bool unknown_rndv = false;
  // Eager bytes the harness did not write (a raw descriptor's) may reach
  // its receives from an endpoint of the job (property 5 skips them).
  bool unknown_eager = false;
};

// One endpoint position as its client sees it.
struct Client {
  shm::Mapping segment;  // the client's own mapping of its segment
  bool live = false;
  uint32_t job = 0;  // index into Node::jobs_
  uint32_t lives = 0;
  std::shared_ptr<Endpoint> ep;
  shm::ClientRings rings;
  shm::SendArena arena;
  std::vector<uint64_t> recvs;   // tokens of posted receives
  std::vector<uint64_t> probes;  // tokens of claiming probes
  struct Go {
    uint64_t transfer;
    uint32_t send_bytes;
    uint32_t sent;
    const uint8_t* src;  // the message's bytes, or null (not tracked)
    uint32_t src_len;
  };
  std::vector<Go> gos;  // rendezvous sends cleared to stream
  struct AmIn {
    uint32_t from_id;
    uint64_t req;
    uint32_t handler;
  };
  std::vector<AmIn> ams;  // active messages that could be acknowledged
  // Property 5, by token: tracked rendezvous sends and receives.
  struct Sent {
    const uint8_t* buf;
    uint32_t len;
    bool go = false;
    bool await_done = false;  // its go said kGoAwaitDone
    bool ended = false;
  };
  std::map<uint64_t, Sent> sends;
  struct Received {
    uint8_t* buf;
    uint32_t capacity;
    bool matched = false;  // kRecvRndv came
    bool ended = false;
    uint32_t expect = 0;  // bytes to come: min(message, capacity)
    uint32_t got = 0;
    std::map<uint32_t, uint32_t> ranges;  // what came: offset -> end
    uint64_t src_epid = 0;
    std::array<uint32_t, 3> tag{};
    uint64_t match = 0;  // its place among this client's matches
  };
  std::map<uint64_t, Received> received;
  uint64_t matches = 0;
};

// The fabric as the engine sees it (other_nodes.h), on the engine that owns
// it: what goes to another node is sent (its payload released, as the
// Remote does once the frame went), and that node answers every request
// that waits for it with PSM2_EPID_UNREACHABLE (a node that never answers
// well). Only the identity of another shard's endpoint is read.
class FakeFabric : public OtherNodes {
 public:
  explicit FakeFabric(MqEngine* engine) : engine_(engine) {}
  bool hold = false;  // sends and requests wait (a full queue, kXoff)

  bool Send(Endpoint& sender, const shm::SubmissionDesc& d, const PeerLink& to,
            bool may_hold) override {
    CheckLink(to);
    if (hold && may_hold) return false;
    shm::PayloadOf(sender.job()->pool().base(), d).Release();
    if (to.gone || d.op == shm::SubmitOp::kRndvSend ||
        (d.flags & shm::kSendSync)) {
      engine_->PostErrorFor(sender, d.req, PSM2_EPID_UNREACHABLE);
    }
    return true;
  }
  bool AmRequest(Endpoint& sender, const shm::SubmissionDesc& d,
                 const PeerLink& to, bool may_hold) override {
    CheckLink(to);
    if (hold && may_hold) return false;
    shm::PayloadOf(sender.job()->pool().base(), d).Release();
    if (to.gone) engine_->PostErrorFor(sender, d.req, PSM2_EPID_UNREACHABLE);
    return true;
  }
  void AmReplyOrAck(Endpoint& sender, const shm::SubmissionDesc& d) override {
    if (!IsProxy(d.peer)) Fail("an answer to another node names no proxy");
    shm::PayloadOf(sender.job()->pool().base(), d).Release();
  }
  bool RndvData(Endpoint&, const shm::SubmissionDesc&) override {
    return false;  // it starts no transfer (StartTransfer fails them)
  }
  void CompleteSync(const Endpoint&, const UnexpectedMsg& m, int32_t) override {
    if (m.remote_src != kRemoteEpid) Fail("an answer to a local sender");
  }
  void StartTransfer(Endpoint& receiver, uint64_t recv_req, uint32_t send_bytes,
                     const UnexpectedMsg& m) override {
    if (m.remote_src != kRemoteEpid) Fail("a transfer from a local sender");
    if (send_bytes > 0) {
      engine_->PostErrorFor(receiver, recv_req, PSM2_EPID_UNREACHABLE);
    }
  }
  void EndpointRemoved(uint32_t) override {}

 private:
  static void CheckLink(const PeerLink& to) {
    if (to.endpoint_id != kRemotePeer || to.epid != kRemoteEpid)
      Fail("a send to another node on a local link");
  }
  MqEngine* const engine_;
};

// A frame from another node the fabric has read and not handed over.
struct Parked {
  uint32_t id = 0;  // its receiver
  bool am = false;
  uint64_t chunk = 0;  // its payload in the inbox, or 0
  MsgKey key{};
  UnexpectedMsg m{};
  shm::CompletionDesc c{};
};

class Node {
 public:
  explicit Node(uint32_t shards) : shards_(shards) {
    fake_now_ns = kClockStart;
    MakeEngines();
    auto account = std::make_shared<UidAccount>();
    MakeJob(0xA, 3, account);
    MakeJob(0xB, 1, account);
    for (uint32_t pos = 0; pos < clients_.size(); pos++) AddAt(pos);
  }

  void Run(Reader& in) {
    while (!in.done()) Step(in);
    // Drain, read everything, then close every endpoint, and let the
    // shards finish what crosses between them.
    for (int i = 0; i < 32 && PollAll(); i++) {
    }
    for (uint32_t pos = 0; pos < clients_.size(); pos++) Reap(pos, ~0u);
    CopiesEnd();
    for (uint32_t pos = 0; pos < clients_.size(); pos++) RemoveAt(pos);
    for (int i = 0; i < 32 && PollAll(); i++) {
    }
    Quiesce();  // property 6
    for (JobState& j : jobs_) {
      if (j.job->unexpected_cost != 0) Fail("a job's budget still charged");
      if (!j.scribbled) {
        for (uint64_t off : j.tracked) {
          if (shm::ChunkOf(j.job->pool().base(), off)
                  ->state.load(std::memory_order_relaxed) !=
              shm::kChunkReleased) {
            fprintf(stderr, "chunk at pool offset %llu of job %x\n",
                    static_cast<unsigned long long>(off), j.tag);
            Fail("a pool chunk was never released");
          }
        }
      }
    }
    if (jobs_[0].job->account().unexpected_cost != 0)
      Fail("the uid's budget still charged");
  }

 private:
  void MakeJob(uint8_t tag, uint32_t positions,
               std::shared_ptr<UidAccount> account) {
    std::string error;
    shm::Mapping pool;
    const uint32_t regions = positions * kLivesPerPosition;
    if (!shm::Mapping::Create("fuzz-pool", (regions + 1) * kRegionBytes,
                              geteuid(), getegid(), &pool, &error)) {
      fprintf(stderr, "%s\n", error.c_str());
      abort();
    }
    JobState j;
    j.tag = tag;
    // The inbox after the endpoints' regions, where psmd has it (a
    // successor checks a payload from another node against it).
    j.job = std::make_shared<Job>(JobKey{Uuid{tag}, geteuid()}, std::move(pool),
                                  regions, kRegionBytes, std::move(account),
                                  /*inbox=*/true);
    j.first = j.job;
    const SendRegion inbox = *j.job->InboxRegion();
    j.inbox = shm::SendArena(j.job->pool().base(), inbox.offset, inbox.bytes);
    j.epids.insert(kRemoteEpid);
    for (uint32_t i = 0; i < positions; i++) {
      j.positions.push_back(static_cast<uint32_t>(clients_.size()));
      Client c;
      c.job = static_cast<uint32_t>(jobs_.size());
      clients_.push_back(std::move(c));
      ids_.push_back(0);
    }
    jobs_.push_back(std::move(j));
  }

  void AddAt(uint32_t pos) {
    Client& c = clients_[pos];
    JobState& j = jobs_[c.job];
    if (c.live || c.lives >= kLivesPerPosition) return;
    const uint32_t lives = c.lives + 1;
    auto region = j.job->TakeRegion();
    if (!region) return;
    j.regions_taken++;
    const uint32_t id = next_id_++;
    auto ep = MakeTestEndpoint(j.job, *region, id, 0x1000 + id, kRingCapacity,
                               16 << 10);
    AttachThisProcess(*ep);
    j.epids.insert(ep->epid());
    ids_[pos] = ep->id();
    c = Client{};
    c.live = true;
    c.job = static_cast<uint32_t>(&j - jobs_.data());
    c.lives = lives;
    c.ep = ep;
    c.segment = DupMapping(ep->segment());
    c.rings = shm::ClientRingsOf(c.segment.base(), ep->geometry());
    c.arena =
        shm::SendArena(j.first->pool().base(), region->offset, region->bytes);
    // Known to the fabric's shard before its own adds it (Workers).
    if (&EngineOf(ep->id()) != engines_[0].get()) engines_[0]->AddForeign(ep);
    EngineOf(ep->id()).Add(ep);
    // Slot i of every endpoint of the job names the job's i-th position
    // (a position closed for good keeps naming the endpoint that left).
    for (uint32_t slot = 0; slot < j.positions.size(); slot++) {
      EngineOf(ep->id()).SetPeer(
          ep->id(), slot,
          PeerLink{ids_[j.positions[slot]],
                   0x1000 + uint64_t{ids_[j.positions[slot]]}});
    }
    for (uint32_t slot = 0; slot < j.positions.size(); slot++) {
      uint32_t other = j.positions[slot];
      if (other != pos && clients_[other].live) {
        for (uint32_t s = 0; s < j.positions.size(); s++) {
          if (j.positions[s] == pos)
            EngineOf(ids_[other])
                .SetPeer(ids_[other], s, PeerLink{ep->id(), ep->epid()});
        }
      }
    }
  }

  void RemoveAt(uint32_t pos) {
    Client& c = clients_[pos];
    if (!c.live) return;
    // Its frames parked at the fabric find no receiver: their payloads go
    // back into the inbox (a rendezvous sender is told, here nobody).
    for (auto f = parked_.begin(); f != parked_.end();) {
      if (f->id != c.ep->id()) {
        ++f;
        continue;
      }
      if (f->chunk != 0) {
        shm::ReleaseChunk(jobs_[c.job].job->pool().base(), f->chunk);
      }
      f = parked_.erase(f);
    }
    EngineOf(c.ep->id()).Remove(c.ep->id());
    JobState& j = jobs_[c.job];
    j.job->RetireRegion(c.ep->region());
    j.job->endpoints--;
    c.live = false;
    c.ep.reset();
  }

  uint64_t Token(const Client& c, uint64_t raw) const {
    return (raw & ((uint64_t{1} << 56) - 1)) |
           (uint64_t{jobs_[c.job].tag} << 56);
  }

  // Publishes `d` from `c`; `chunk` is the pool chunk it hands over (0:
  // none). A chunk of a submission the client could not publish, or that
  // the validator will reject, stays the client's (released or not).
  bool Submit(Client& c, const shm::SubmissionDesc& d, shm::Ring ring,
              uint64_t chunk) {
    auto& r = ring == shm::Ring::kMessage ? c.rings.msg_sq : c.rings.ctl_sq;
    if (!r.TryPush(d)) {
      if (chunk != 0) shm::ReleaseChunk(jobs_[c.job].job->pool().base(), chunk);
      return false;
    }
    if (chunk != 0) {
      SubmissionBounds b;
      b.peer_slots = static_cast<uint32_t>(jobs_[c.job].positions.size());
      b.region = c.ep->region();
      const bool valid = ValidateSubmission(d, ring, b) == Rejection::kNone;
      if (valid) jobs_[c.job].tracked.insert(chunk);
      if (trace_) {
        fprintf(stderr, "  op %d hands over chunk %llu (%s)\n",
                static_cast<int>(d.op), static_cast<unsigned long long>(chunk),
                valid ? "valid" : "rejected");
      }
    }
    return true;
  }

  // The ring `d` belongs on, or (one time in eight) the other one.
  static shm::Ring RingFor(Reader& in, const shm::SubmissionDesc& d) {
    shm::Ring right = shm::TraitsOf(d.op).ring;
    if ((in.U8() & 7) != 7) return right;
    return right == shm::Ring::kMessage ? shm::Ring::kControl
                                        : shm::Ring::kMessage;
  }

  // Puts `len` payload bytes of `d` in the pool (or inline). Returns the
  // chunk, 0 for none, or nullopt when the region is full.
  std::optional<uint64_t> AttachPayload(Client& c, shm::SubmissionDesc& d,
                                        Reader& in) {
    if (!shm::PayloadInPool(d)) {
      if (d.len <= sizeof(d.body.inline_data))
        in.Bytes(d.body.inline_data, d.len < 8 ? d.len : 8);
      return uint64_t{0};
    }
    auto off = c.arena.Allocate(d.len);
    if (!off) return std::nullopt;
    Forget(jobs_[c.job], *off, d.len);
    d.body.pool.pool_offset = *off;
    std::memset(jobs_[c.job].job->pool().base() + *off, 0x5a,
                d.len < 64 ? d.len : 64);
    return *off;
  }

  // The arena reuses the place of released chunks: a new chunk's header
  // and payload may cover their headers (not only at the same offset), and
  // the bytes written into it overwrite their state words. Those chunks
  // were released (the arena reclaims nothing else); they are forgotten,
  // and the new one is tracked anew (or not).
  static void Forget(JobState& j, uint64_t off, uint32_t len) {
    j.tracked.erase(j.tracked.lower_bound(off),
                    j.tracked.lower_bound(off + len + shm::kChunkHeaderBytes));
  }

  uint32_t Slot(Reader& in, const Client& c) {
    // One past the last slot is out of range.
    return in.Range(0, static_cast<uint32_t>(jobs_[c.job].positions.size()));
  }

  void Tag(Reader& in, uint32_t tag[3]) {
    tag[0] = in.U8() & 3;
    tag[1] = in.U8() & 1;
    tag[2] = 0;
  }

  void Step(Reader& in) {
    const bool first = !stepped_;
    stepped_ = true;
    const uint8_t op = in.U8() % kOpCount;
    const uint32_t pos = in.U8() % clients_.size();
    Client& c = clients_[pos];
    const bool needs_live = op != kTurn && op != kReAdd && op != kScribble &&
                            op != kHandover && op != kCopyInPlace &&
                            op != kAdvance;
    if (needs_live && !c.live) return;
    if (trace_) fprintf(stderr, "op %d at pos %u\n", op, pos);
    uint32_t tag[3];
    const uint32_t full_sel[3] = {~0u, ~0u, ~0u};
    switch (op) {
      case kRaw: {
        shm::SubmissionDesc d;
        in.Bytes(&d, sizeof(d));
        d.req = Token(c, d.req & (kTracked - 1));
        RawPlaces(d, jobs_[c.job]);
        Submit(c, d, in.Bool() ? shm::Ring::kMessage : shm::Ring::kControl, 0);
        break;
      }
      case kSend:
      case kRndvSend: {
        Tag(in, tag);
        const bool rndv = op == kRndvSend;
        uint32_t len = in.Len(rndv ? kMaxLen : 9000);
        uint32_t slot = Slot(in, c);
        uint64_t token = Token(c, in.U16());
        const uint8_t f = in.U8();
        uint8_t* buf = nullptr;
        if (rndv) {
          // Property 5: a message of its own id and pattern, named for a
          // copy in place if the input says.
          buf = memory_.Take(len);
          if (buf == nullptr) {
            jobs_[c.job].unknown_rndv = true;
          } else {
            const uint64_t id = next_tracked_++;
            FillMessage(buf, id, len);
            token = Token(c, kTracked | id);
            messages_[id] = c.ep->epid();
            c.sends[token] = Client::Sent{buf, len};
          }
        }
        shm::SubmissionDesc d = shm::PrepSend(slot, token, tag, len, rndv);
        if (buf != nullptr && (f & 1)) shm::PlaceInMemory(d, buf);
        if (!rndv) {
          if (f & 1) d.flags |= shm::kSendSync;
          if ((f & 6) == 6) {
            d.flags |= shm::kSendFailed;
            d.len = 0;
          }
        }
        shm::Ring ring = RingFor(in, d);
        auto chunk = AttachPayload(c, d, in);
        if (!chunk) break;
        if (!rndv && d.len >= 8) {
          // Property 5: an eager message of its own id and pattern (the
          // input's bytes, read by AttachPayload, are overwritten).
          const uint64_t id = next_tracked_++;
          FillMessage(shm::PayloadInPool(d)
                          ? jobs_[c.job].first->pool().base() + *chunk
                          : d.body.inline_data,
                      id, d.len);
          messages_[id] = c.ep->epid();
        }
        Submit(c, d, ring, *chunk);
        break;
      }
      case kRecv:
      case kProbe: {
        Tag(in, tag);
        const uint32_t none[3] = {0, 0, 0};
        const uint32_t* sel = in.Bool() ? full_sel : none;
        uint32_t slot = in.Bool() ? shm::kAnySlot : Slot(in, c);
        uint64_t token = Token(c, in.U16());
        shm::SubmissionDesc d;
        if (op == kRecv) {
          uint32_t capacity = in.Len(kMaxLen);
          // Property 5: a buffer the stream is copied into, named for a
          // copy in place or not.
          const uint8_t place = in.U8();
          uint8_t* buf = (place & 1) ? memory_.Take(capacity) : nullptr;
          if (buf != nullptr) token = Token(c, kTracked | next_tracked_++);
          d = shm::PrepRecv(slot, token, tag, sel, capacity);
          if (buf != nullptr) {
            c.received[token] = Client::Received{buf, capacity};
            if (place & 2) shm::PlaceInMemory(d, buf);
          }
        } else {
          bool claim = in.Bool();
          d = shm::PrepProbe(slot, token, tag, sel, claim);
        }
        if (Submit(c, d, RingFor(in, d), 0)) {
          auto& list = op == kRecv ? c.recvs : c.probes;
          if (list.size() < 16) list.push_back(token);
        }
        break;
      }
      case kClaimedRecv:
      case kCancel: {
        auto& list = op == kCancel ? c.recvs : c.probes;
        uint64_t target =
            list.empty() ? Token(c, in.U16()) : list[in.U8() % list.size()];
        shm::SubmissionDesc d =
            op == kCancel ? shm::PrepCancel(Token(c, in.U16()), target)
                          : shm::PrepClaimedRecv(target, in.Len(kMaxLen));
        // A claimed rendezvous message may be copied in place too (its
        // bytes are not followed: the probe's token is the input's).
        if (op == kClaimedRecv && (in.U8() & 1)) {
          shm::PlaceInMemory(d, memory_.Take(d.len));
        }
        Submit(c, d, RingFor(in, d), 0);
        break;
      }
      case kRndvData: {
        Client::Go* go =
            c.gos.empty() ? nullptr : &c.gos[in.U8() % c.gos.size()];
        uint64_t transfer = go ? go->transfer : in.U8();
        uint32_t left = go ? go->send_bytes - go->sent : 1;
        uint32_t limit = static_cast<uint32_t>(c.arena.MaxPayload());
        uint32_t len = in.Range(1, left < limit ? left : limit);
        uint64_t offset = go ? go->sent : 0;
        if (in.U8() == 0xff) offset += in.U8();  // out of order
        shm::SubmissionDesc d =
            shm::PrepRndvData(Token(c, in.U16()), transfer, offset, len);
        shm::Ring ring = RingFor(in, d);
        auto chunk = AttachPayload(c, d, in);
        // The chunk holds the message's bytes at its offset, as the
        // sender's library copies them (property 5).
        if (go == nullptr || go->src == nullptr) {
          jobs_[c.job].unknown_rndv = true;
        } else if (chunk && offset < go->src_len) {
          std::memcpy(jobs_[c.job].first->pool().base() + *chunk,
                      go->src + offset,
                      std::min<uint64_t>(len, go->src_len - offset));
        }
        if (chunk && Submit(c, d, ring, *chunk) && go) {
          go->sent += len;
          if (go->sent >= go->send_bytes)
            c.gos.erase(c.gos.begin() + (go - c.gos.data()));
        }
        break;
      }
      case kSetOption: {
        uint8_t k = in.U8();
        uint64_t value = k < 200 ? uint64_t{in.U16()} << (k % 12) : in.U64();
        shm::SubmissionDesc d = shm::PrepSetOption(
            Token(c, in.U16()), static_cast<shm::QueueOption>(k < 240 ? 1 : k),
            value);
        Submit(c, d, RingFor(in, d), 0);
        break;
      }
      case kAmRequest:
      case kAmReply: {
        const bool reply = op == kAmReply;
        // A reply names an endpoint id: any id so far, of either job.
        uint32_t peer = reply ? in.Range(0, next_id_) : Slot(in, c);
        uint32_t handler = in.U8() < 250 ? in.U8() % 4 : in.U16();
        uint32_t nargs = in.Range(0, shm::kAmMaxArgs + 1);
        uint32_t payload = in.Len(shm::kAmMaxPayload + 64);
        shm::SubmissionDesc d = shm::PrepActiveMessage(
            reply, peer, Token(c, in.U16()), handler, nargs, payload);
        d.flags = in.U8() & 7;
        shm::Ring ring = RingFor(in, d);
        auto chunk = AttachPayload(c, d, in);
        if (chunk) Submit(c, d, ring, *chunk);
        break;
      }
      case kAmAck: {
        Client::AmIn am{in.Range(0, next_id_), in.U64(), in.U8()};
        if (!c.ams.empty() && in.Bool()) am = c.ams[in.U8() % c.ams.size()];
        shm::SubmissionDesc d =
            shm::PrepAmAck(am.from_id, am.req, am.handler,
                           in.Bool() ? PSM2_OK : PSM2_NO_MEMORY);
        d.req = Token(c, d.req & (kTracked - 1));
        Submit(c, d, RingFor(in, d), 0);
        break;
      }
      case kScribble: {
        JobState& j = jobs_[in.U8() % jobs_.size()];
        const shm::Mapping& pool = j.job->pool();
        uint64_t off = in.U32() % pool.size();
        uint32_t n = in.U8() % 72;
        if (n > pool.size() - off) n = static_cast<uint32_t>(pool.size() - off);
        in.Bytes(pool.base() + off, n);
        j.scribbled = true;
        break;
      }
      case kTurn: {
        uint32_t turns = 1 + in.U8() % 4;
        for (uint32_t i = 0; i < turns; i++) PollAll();
        for (auto& e : engines_) {
          e->AnySubmissionPending();
          e->NotifyClients();
        }
        break;
      }
      case kReap:
        Reap(pos, 1 + in.U8() % 32);
        break;
      case kRemove:
        RemoveAt(pos);
        break;
      case kReAdd:
        AddAt(pos);
        break;
      case kHandover:
        // A few per run: each costs a node's worth of mappings, and the
        // CI run's inputs are many. Not while frames from the other node
        // are parked: psmd waits for their receivers or refuses
        // (daemon/remote/remote_handover.cc). What the engines hold for
        // the fabric and from it is theirs to carry; what the fabric holds
        // (whether it takes sends) the Remote carries, and so does the
        // harness.
        if (handovers_ < kMaxHandovers && parked_.empty()) {
          handovers_++;
          Handover();
        }
        break;
      case kDisconnect:
      case kReconnect: {
        const JobState& j = jobs_[c.job];
        uint32_t slot = in.U8() % j.positions.size();
        uint32_t peer = ids_[j.positions[slot]];
        if (op == kDisconnect) {
          EngineOf(c.ep->id()).ClearPeer(c.ep->id(), slot);
        } else {
          EngineOf(c.ep->id())
              .SetPeer(c.ep->id(), slot,
                       PeerLink{peer, 0x1000 + uint64_t{peer}});
        }
        break;
      }
      case kFrame:
        fabric_used_ = true;
        Frame(in, c);
        break;
      case kRemoteLink: {
        fabric_used_ = true;
        const JobState& j = jobs_[c.job];
        uint32_t slot = in.U8() % j.positions.size();
        PeerLink link{kRemotePeer, kRemoteEpid};
        link.gone = (in.U8() & 7) == 7;
        EngineOf(c.ep->id()).SetPeer(c.ep->id(), slot, link);
        break;
      }
      case kNodeEvent: {
        fabric_used_ = true;
        MqEngine& fabric = *engines_[0];
        if (in.Bool()) {
          shm::CompletionDesc lost{};
          lost.op = shm::CompleteOp::kNodeLost;
          lost.error = in.Bool() ? PSM2_EPID_UNREACHABLE : PSM2_TIMEOUT;
          lost.tag[0] = shm::NodeIdOf(kRemoteEpid);
          fabric.NodeLost(lost);
        } else {
          const JobState& j = jobs_[in.U8() % jobs_.size()];
          fabric.EpidGone(kRemoteEpid, geteuid(), j.job->key().uuid.data());
        }
        break;
      }
      case kFabricHold:
        fabric_used_ = true;
        fabric_->hold = in.Bool();
        break;
      case kCopyInPlace: {
        // As the first op only, as psmd is configured: a copier replaced
        // would drop the copies in it, and one per engine made for most
        // inputs (where a later op byte says so) made the CI run's time
        // that of starting and joining their threads on a loaded machine.
        const uint8_t k = in.U8();
        if (!first) break;
        static constexpr uint64_t kAfterNs[4] = {0, 1'000'000, 10'000'000,
                                                 200'000'000};
        copy_ = CopyConfig{(k & 4) ? uint64_t{64} << 10 : 1, kAfterNs[k & 3]};
        for (auto& e : engines_) EnableCopies(*e);
        break;
      }
      case kAdvance: {
        const uint8_t k = in.U8();
        // Up to 133 ms, in steps of about 1 ms.
        fake_now_ns += static_cast<uint64_t>(k & 0x7f) << 20;
        // And the copies running end before the next step, as a receiver
        // computing long enough would find them (no ring is read).
        // Not with the fabric: what it holds is not quiesced (kHandover).
        if ((k & 0x80) && !fabric_used_) Quiesce();
        break;
      }
      default:
        break;
    }
  }

  // A message or active message from the endpoint on another node reaches
  // `c` as the Remote hands it over: whole, its payload in the job's inbox,
  // parked while the receiver cannot take it (behind what is parked for it
  // already), in order.
  void Frame(Reader& in, Client& c) {
    JobState& j = jobs_[c.job];
    Parked f;
    f.id = c.ep->id();
    f.am = in.Bool();
    const uint32_t len = f.am ? in.Len(shm::kAmMaxPayload) : in.Len(9000);
    const bool rndv = !f.am && (in.U8() & 3) == 3;
    if (!rndv && !shm::IsInline(len)) {
      auto off = j.inbox.Allocate(len);
      if (!off) return;  // the inbox is full: the frame waits unread
      Forget(j, *off, len);
      std::memset(j.job->pool().base() + *off, 0x3c, len < 64 ? len : 64);
      j.tracked.insert(*off);
      f.chunk = *off;
    }
    uint32_t tag[3];
    Tag(in, tag);
    const uint64_t token = Token(c, in.U16());
    if (f.am) {
      shm::CompletionDesc& a = f.c;
      a.op =
          in.Bool() ? shm::CompleteOp::kAmRequest : shm::CompleteOp::kAmReply;
      a.flags = in.U8() & shm::kAmRequestWantsAck;
      a.req = token;
      a.tag[0] = tag[0];
      a.tag[2] = kProxyBase + 1;  // the Remote's proxy id of the sender
      a.msg_len = len;
      a.src_epid = kRemoteEpid;
      if (f.chunk == 0) {
        a.flags |= shm::kPayloadInline;
      } else {
        a.body.pool.pool_offset = f.chunk;
      }
    } else {
      UnexpectedMsg& m = f.m;
      m.flags = (in.U8() & 1) ? shm::kSendSync : 0;
      m.rendezvous = rndv;
      m.len = len;
      m.sender_req = token;
      m.pool_offset = f.chunk;
      m.remote_src = kRemoteEpid;
      f.key = KeyOf(kRemoteEpid, tag);
    }
    parked_.push_back(f);
    RetryParked();
  }

  // Offers the parked frames again, each receiver's in order.
  bool RetryParked() {
    bool did = false;
    std::set<uint32_t> blocked;
    for (auto f = parked_.begin(); f != parked_.end();) {
      if (blocked.count(f->id) == 0 && Offer(*f)) {
        f = parked_.erase(f);
        did = true;
      } else {
        blocked.insert(f->id);
        ++f;
      }
    }
    return did;
  }

  bool Offer(const Parked& f) {
    MqEngine& fabric = *engines_[0];
    Endpoint* r = fabric.FindAny(f.id);
    if (r == nullptr) Fail("a frame parked for an endpoint that left");
    if (!fabric.IsLocal(*r)) {
      if (!fabric.MayArriveAcross(*r)) return false;
      if (f.am) {
        fabric.AmArriveAcross(*r, f.c);
      } else {
        fabric.ArriveAcross(*r, f.key, f.m);
      }
      return true;
    }
    if (f.am) {
      if (MqEngine::AmHeld(*r)) return false;
      fabric.Post(*r, f.c);
      return true;
    }
    return fabric.Arrive(*r, f.key, f.m) != MqEngine::Arrival::kHeld;
  }

  // Reads up to `max` completions of position `pos` as its client would;
  // how many it read.
  uint32_t Reap(uint32_t pos, uint32_t max) {
    Client& c = clients_[pos];
    if (!c.live) return 0;
    JobState& j = jobs_[c.job];
    shm::CompletionDesc d;
    uint32_t i = 0;
    for (; i < max && c.rings.cq.TryPop(&d); i++) {
      // Property 1: only completions of this job reach this endpoint.
      if (d.op != shm::CompleteOp::kAmAcked &&
          d.op != shm::CompleteOp::kNodeLost && (d.req >> 56) != j.tag)
        Fail("a completion for another job's submission");
      if (d.src_epid != 0 && j.epids.count(d.src_epid) == 0)
        Fail("a completion from an endpoint of another job");
      if (shm::CompletionCarriesChunk(d)) {
        uint64_t off = shm::ChunkOffsetOf(d);
        if (off < shm::kChunkHeaderBytes || off >= j.job->pool().size() ||
            off % shm::kCacheLine != 0) {
          Fail("a completion's chunk outside the job's pool");
        }
      }
      if (trace_) {
        fprintf(stderr, "pos %u reaps op %d error %d req %llx len %u\n", pos,
                static_cast<int>(d.op), d.error,
                static_cast<unsigned long long>(d.req), d.msg_len);
      }
      Follow(pos, d);  // property 5, before the chunk goes back
      shm::PayloadOf(j.job->pool().base(), d).Release();
      switch (d.op) {
        case shm::CompleteOp::kRndvGo:
          if (d.error == PSM2_OK && d.body.go.send_bytes > 0 &&
              c.gos.size() < 8) {
            auto sent = c.sends.find(d.req);
            const bool known = sent != c.sends.end();
            c.gos.push_back({d.body.go.transfer, d.body.go.send_bytes, 0,
                             known ? sent->second.buf : nullptr,
                             known ? sent->second.len : 0});
          }
          break;
        case shm::CompleteOp::kAmRequest:
        case shm::CompleteOp::kAmReply:
          if (c.ams.size() < 8) c.ams.push_back({d.tag[2], d.req, d.tag[0]});
          break;
        default:
          break;
      }
    }
    return i;
  }

  // Property 5 for completion `d` of position `pos`: what it says of a
  // tracked send or receive, and the bytes a chunk brings.
  void Follow(uint32_t pos, const shm::CompletionDesc& d) {
    Client& c = clients_[pos];
    if (d.op == shm::CompleteOp::kRecvDone ||
        (d.op == shm::CompleteOp::kProbeDone &&
         (d.flags & shm::kPayloadClaimed))) {
      FollowEager(pos, d);
    }
    if (auto s = c.sends.find(d.req); s != c.sends.end()) {
      Client::Sent& sent = s->second;
      if (sent.ended) Fail("a completion for a send that ended");
      switch (d.op) {
        case shm::CompleteOp::kRndvGo:
          if (sent.go) Fail("a second go for one send");
          sent.go = true;
          sent.await_done = (d.flags & shm::kGoAwaitDone) != 0;
          // Without kGoAwaitDone the send ends with its last chunk, which
          // the client publishes: psmd says nothing more, unless it fails.
          sent.ended = d.error != PSM2_OK;
          break;
        case shm::CompleteOp::kSendDone:
          // (One that failed before its match may end so: a closed peer.)
          if (!sent.go && d.error == PSM2_OK) Fail("a send done before its go");
          sent.ended = true;
          break;
        case shm::CompleteOp::kError:
          sent.ended = true;
          break;
        default:
          Fail("a completion of another kind for a rendezvous send");
      }
      return;
    }
    auto r = c.received.find(d.req);
    if (r == c.received.end()) return;
    Client::Received& rv = r->second;
    if (rv.ended) Fail("a completion for a receive that ended");
    switch (d.op) {
      case shm::CompleteOp::kRecvRndv:
        if (rv.matched) Fail("a receive matched twice");
        rv.matched = true;
        rv.expect = std::min(d.msg_len, rv.capacity);
        rv.src_epid = d.src_epid;
        std::copy(d.tag, d.tag + 3, rv.tag.begin());
        rv.match = ++c.matches;
        rv.ended = d.error != PSM2_OK;
        break;
      case shm::CompleteOp::kRndvChunk: {
        if (!rv.matched) Fail("a chunk before its receive matched");
        if (d.error != PSM2_OK) {
          rv.ended = true;
          break;
        }
        const uint64_t off = d.body.chunk.offset;
        const uint32_t len = d.body.chunk.len;
        if (off + len > rv.expect) Fail("a chunk past the message");
        auto next = rv.ranges.lower_bound(static_cast<uint32_t>(off));
        if ((next != rv.ranges.end() && next->first < off + len) ||
            (next != rv.ranges.begin() && std::prev(next)->second > off))
          Fail("a byte of a message delivered twice");
        rv.ranges[static_cast<uint32_t>(off)] =
            static_cast<uint32_t>(off + len);
        rv.got += len;
        if (d.flags & shm::kPayloadPlaced) {
          if (trace_) fprintf(stderr, "  %u bytes placed by psmd\n", len);
        } else {  // the library's copy out of the pool
          const JobState& j = jobs_[c.job];
          std::memcpy(rv.buf + off,
                      j.job->pool().base() + shm::ChunkOffsetOf(d), len);
        }
        break;
      }
      default:  // an eager message, an error: the receive ended
        rv.ended = true;
        return;
    }
    if (rv.matched && !rv.ended && rv.got == rv.expect) {
      rv.ended = true;
      CheckReceived(pos, rv);
    }
  }

  // Property 5 for an eager message a receive or a claiming probe got: it
  // is the message's own bytes, from the sender it was told, delivered
  // once, and a receive gets one sender's messages of one tag in the order
  // sent. (A claim matched at its probe, before the receive that takes it:
  // its order is not judged.) Skipped for frames from another node (the
  // input's bytes), and where the harness did not write every eager byte.
  void FollowEager(uint32_t pos, const shm::CompletionDesc& d) {
    Client& c = clients_[pos];
    const JobState& j = jobs_[c.job];
    if (d.msg_len < 8 || d.src_epid == kRemoteEpid || j.unknown_eager ||
        j.scribbled || (d.error != PSM2_OK && d.error != PSM2_MQ_TRUNCATION))
      return;
    const uint8_t* p = (d.flags & shm::kPayloadInline)
                           ? d.body.inline_data
                           : j.job->pool().base() + d.body.pool.pool_offset;
    uint64_t head = 0;
    std::memcpy(&head, p, 8);
    const uint64_t id = head & ~kIdMark;
    auto m = messages_.find(id);
    if ((head & kIdMark) != kIdMark || m == messages_.end())
      Fail("an eager receive holds bytes of no message");
    if (m->second != d.src_epid) Fail("an eager message from another sender");
    if (std::memcmp(p + 8, MessageBytes(id) + 8, d.msg_len - 8) != 0)
      Fail("an eager message's bytes changed on their way");
    if (!delivered_.insert(id).second) Fail("an eager message delivered twice");
    if (d.op != shm::CompleteOp::kRecvDone) return;
    auto& seen = order_[{d.src_epid, c.ep->epid(),
                         (uint64_t{d.tag[0]} << 32) | d.tag[1], d.tag[2]}];
    const uint64_t match = ++c.matches;
    if (!seen.empty() && seen.rbegin()->second > id)
      Fail("one sender's messages received out of order");
    seen[match] = id;
  }

  // Property 5 for a receive that got all its bytes: they are the
  // message's, from the sender it was told, in that sender's order.
  void CheckReceived(uint32_t pos, const Client::Received& rv) {
    const Client& c = clients_[pos];
    if (jobs_[c.job].unknown_rndv || jobs_[c.job].scribbled || rv.expect < 8)
      return;
    uint64_t head = 0;
    std::memcpy(&head, rv.buf, 8);
    const uint64_t id = head & ~kIdMark;
    auto m = messages_.find(id);
    if ((head & kIdMark) != kIdMark || m == messages_.end())
      Fail("a receive holds bytes of no message");
    if (m->second != rv.src_epid) Fail("a message from another sender");
    if (std::memcmp(rv.buf + 8, MessageBytes(id) + 8, rv.expect - 8) != 0)
      Fail("a message's bytes changed on their way");
    // One sender's messages of one tag: any receive that matched a later
    // one would have matched this one (MPI's non-overtaking).
    auto& seen = order_[{rv.src_epid, c.ep->epid(),
                         (uint64_t{rv.tag[0]} << 32) | rv.tag[1], rv.tag[2]}];
    auto after = seen.upper_bound(rv.match);
    if ((after != seen.end() && after->second < id) ||
        (after != seen.begin() && std::prev(after)->second > id))
      Fail("one sender's messages received out of order");
    seen[rv.match] = id;
  }

  // A raw descriptor that names a buffer for a copy in place names one in
  // the scratch (whatever its address said), so that psmd's copies stay in
  // memory a client could own; its rendezvous bytes are not the harness's.
  void RawPlaces(shm::SubmissionDesc& d, JobState& j) {
    switch (d.op) {
      case shm::SubmitOp::kRecv:
        if (d.flags & shm::kRecvInPlace)
          d.body.recv.addr = scratch_.Within(d.body.recv.addr);
        break;
      case shm::SubmitOp::kRndvSend:
      case shm::SubmitOp::kClaimedRecv:
        if (d.flags & (shm::kSendInPlace | shm::kRecvInPlace))
          d.body.place.addr = scratch_.Within(d.body.place.addr);
        j.unknown_rndv |= d.op == shm::SubmitOp::kRndvSend;
        break;
      case shm::SubmitOp::kRndvData:
        j.unknown_rndv = true;
        break;
      case shm::SubmitOp::kSend:
        j.unknown_eager = true;
        break;
      default:
        break;
    }
  }

  MqEngine& EngineOf(uint32_t id) {
    return *engines_[MqEngine::ShardOf(id, shards_)];
  }

  void EnableCopies(MqEngine& e) {
    e.EnableCrossCopy([] {}, copy_->min_bytes, copy_->after_ns);
  }

  // Property 6's takeovers: time passes beyond copy_after, and the engines
  // run and wait for their copies until the clients have read everything.
  void CopiesEnd() {
    if (!copy_ || handovers_ > 0 || fabric_used_) return;
    fake_now_ns += copy_->after_ns + 1;
    for (int round = 0; round < 8; round++) {
      bool did = false;
      for (int i = 0; i < 32 && PollAll(); i++) did = true;
      Quiesce();
      for (uint32_t pos = 0; pos < clients_.size(); pos++)
        did |= Reap(pos, ~0u) > 0;
      if (!did) break;
    }
    for (const Client& c : clients_) {
      if (!c.live) continue;
      for (const auto& [token, sent] : c.sends) {
        if (sent.await_done && !sent.ended)
          Fail("a send awaiting kSendDone never got it, copy_after passed");
      }
    }
  }

  // The handover protocol's rounds (mq_engine.h): until a round moves
  // nothing and every shard is quiesced. A copy in place keeps a shard
  // from quiescing until the copier ends it: waited for, not failed.
  void Quiesce() {
    const uint64_t deadline = NowNs() + 10'000'000'000;
    for (;;) {
      bool did = false;
      for (auto& e : engines_) did |= e->PollQuiescing();
      bool quiet = !did;
      for (auto& e : engines_) quiet &= e->Quiesced();
      if (quiet) return;
      if (NowNs() > deadline) Fail("the engines never quiesced");
      if (!did) sched_yield();
    }
  }

  void MakeEngines() {
    // The lanes are empty once every shard quiesced: the successor's
    // engines join the same Crossing (a fresh one, as a new process has,
    // is engine_state_test's; allocating its lanes per handover made the
    // CI run ten times slower).
    if (!crossing_) crossing_ = std::make_unique<Crossing>(shards_);
    for (uint32_t s = 0; s < shards_; s++) {
      engines_.push_back(std::make_unique<MqEngine>(
          /*max_unexpected_budget=*/1 << 20,
          /*job_unexpected_budget=*/48 << 10,
          /*uid_unexpected_budget=*/64 << 10));
      engines_.back()->SetCopyClock(FakeNow);
      if (copy_) EnableCopies(*engines_.back());
      if (shards_ > 1) engines_.back()->JoinShards(crossing_.get(), s);
      if (s > 0) engines_.back()->RouteFabricToShard0();
    }
    fabric_ = std::make_unique<FakeFabric>(engines_[0].get());
    engines_[0]->AttachRemote(fabric_.get());
  }

  // Property 4: the protocol of mq_engine.h, then the successor.
  void Handover() {
    Quiesce();
    const bool fabric_holds = fabric_->hold;
    std::vector<std::string> states;
    for (auto& e : engines_) {
      handover::StateWriter w;
      e->SaveState(w);
      states.push_back(w.Take());
    }
    // The successor's jobs (one uid account), regions handed out as before.
    auto account = std::make_shared<UidAccount>();
    std::vector<std::shared_ptr<Job>> jobs;
    for (JobState& j : jobs_) {
      const uint32_t regions =
          static_cast<uint32_t>(j.positions.size()) * kLivesPerPosition;
      jobs.push_back(std::make_shared<Job>(
          j.job->key(), DupMapping(j.job->pool()), regions, kRegionBytes,
          account, /*inbox=*/true));
      for (uint32_t i = 0; i < j.regions_taken; i++) jobs.back()->TakeRegion();
    }
    std::vector<std::shared_ptr<Endpoint>> fresh(clients_.size());
    for (size_t pos = 0; pos < clients_.size(); pos++) {
      Client& c = clients_[pos];
      if (!c.live) continue;
      fresh[pos] = RemakeTestEndpoint(*c.ep, jobs[c.job], 16 << 10);
      AttachThisProcess(*fresh[pos]);  // as the registry does (fd store)
      c.ep.reset();
    }
    engines_.clear();  // the old engines, and with them their endpoints
    for (size_t i = 0; i < jobs_.size(); i++) jobs_[i].job = jobs[i];
    MakeEngines();
    for (size_t pos = 0; pos < clients_.size(); pos++) {
      if (!fresh[pos]) continue;
      clients_[pos].ep = fresh[pos];
      if (&EngineOf(fresh[pos]->id()) != engines_[0].get()) {
        engines_[0]->AddForeign(fresh[pos]);
      }
      EngineOf(fresh[pos]->id()).Add(fresh[pos]);
    }
    std::vector<const MqEngine*> shards;
    for (uint32_t s = 0; s < shards_; s++) {
      handover::StateReader r(states[s].data(), states[s].size());
      Status st = engines_[s]->LoadState(r);
      if (!st.ok()) {
        fprintf(stderr, "%s\n", st.message.c_str());
        Fail("a saved state did not load");
      }
      shards.push_back(engines_[s].get());
    }
    if (!MqEngine::CreditsAgree(shards))
      Fail("credits in flight disagree with the held items");
    fabric_->hold = fabric_holds;
  }
  // A turn of every shard; whether any did something.
  bool PollAll() {
    bool did = false;
    for (auto& e : engines_) did |= e->PollAll();
    if (!parked_.empty()) did |= RetryParked();
    engines_[0]->FlushAcross();
    return did;
  }

  const uint32_t shards_;
  // Before the engines: a copy may write into them until its engine goes.
  ClientMemory memory_{kClientBytes};
  ClientMemory scratch_{kScratchBytes};
  struct CopyConfig {
    uint64_t min_bytes;
    uint64_t after_ns;
  };
  std::optional<CopyConfig> copy_;  // kCopyInPlace came
  bool stepped_ = false;
  uint64_t next_tracked_ = 1;  // ids of tracked messages and receives
  std::map<uint64_t, uint64_t> messages_;  // tracked message id -> epid
  std::set<uint64_t> delivered_;           // tracked eager messages received
  // Property 5's order: by sender epid, receiver epid and tag, the ids of
  // the messages received, by their place among the receiver's matches.
  std::map<std::array<uint64_t, 4>, std::map<uint64_t, uint64_t>> order_;
  static constexpr int kMaxHandovers = 2;
  int handovers_ = 0;
  bool fabric_used_ = false;
  std::unique_ptr<Crossing> crossing_;
  std::vector<std::unique_ptr<MqEngine>> engines_;
  std::unique_ptr<FakeFabric> fabric_;
  std::vector<Parked> parked_;
  std::vector<JobState> jobs_;
  std::vector<Client> clients_;
  std::vector<uint32_t> ids_;  // the endpoint id at each position (last one)
  uint32_t next_id_ = 1;
  // ENGINE_FUZZ_TRACE=1: every reaped completion on stderr (for
  // reproducers), and what psmd placed by copies in place (how often the
  // seeds reach them: `grep -c placed`).
  const bool trace_ = getenv("ENGINE_FUZZ_TRACE") != nullptr;
};

// ---- Seed corpus: well-formed sequences, encoded for Reader ----

class Encoder {
 public:
  Encoder& U8(uint8_t v) {
    out_.push_back(v);
    return *this;
  }
  Encoder& U16(uint16_t v) { return U8(v & 0xff).U8(v >> 8); }
  Encoder& U32(uint32_t v) { return U16(v & 0xffff).U16(v >> 16); }
  Encoder& U64(uint64_t v) { return U32(v & 0xffffffff).U32(v >> 32); }
  Encoder& Range(uint32_t lo, uint32_t v) { return U16(v - lo); }
  Encoder& Len(uint32_t len) {  // through the U32 branch of Reader::Len
    return U8(255).U32(len);
  }
  Encoder& Op(Op op, uint8_t pos) { return U8(op).U8(pos); }
  const std::vector<uint8_t>& bytes() const { return out_; }

  // Reader::Step's field order for each op.
  // `in_place`: a rendezvous send names its buffer (kSendInPlace).
  Encoder& Send(uint8_t from, uint8_t slot, uint8_t tag, uint32_t len,
                bool sync = false, bool rndv = false, bool in_place = false) {
    Op(rndv ? kRndvSend : kSend, from).U8(tag).U8(0).Len(len).Range(0, slot);
    U16(next_token_++);
    U8(rndv ? in_place : sync);
    U8(0);  // the right ring
    if (len <= shm::kInlineMax) {
      for (uint32_t i = 0; i < (len < 8 ? len : 8); i++) U8('a' + i);
    }
    return *this;
  }
  // `place`: 1, a buffer property 5 follows; 3, named for a copy in place.
  Encoder& Recv(uint8_t at, uint8_t slot, uint8_t tag, uint32_t capacity,
                bool probe = false, bool claim = false, uint8_t place = 0) {
    Op(probe ? kProbe : kRecv, at).U8(tag).U8(0).U8(1);  // full selector
    if (slot == 0xff) {
      U8(1);
    } else {
      U8(0).Range(0, slot);
    }
    U16(next_token_++);
    if (probe) {
      U8(claim ? 1 : 0);
    } else {
      Len(capacity).U8(place);
    }
    return U8(0);
  }
  Encoder& RndvSend(uint8_t from, uint8_t slot, uint8_t tag, uint32_t len,
                    bool in_place) {
    return Send(from, slot, tag, len, false, true, in_place);
  }
  // As the first op: copies in place, `after` 0, 1, 10 or 200 ms (0-3), from
  // 64 KiB or from 1 B.
  Encoder& CopyInPlace(uint8_t after, bool from_64k) {
    return Op(kCopyInPlace, 0).U8(after | (from_64k ? 4 : 0));
  }
  // The copy clock moves `ms`; `settle`: the copies running end first.
  Encoder& Advance(uint8_t ms, bool settle) {
    return Op(kAdvance, 0).U8(ms | (settle ? 0x80 : 0));
  }
  Encoder& Turn(uint8_t turns = 4) { return Op(kTurn, 0).U8(turns - 1); }
  Encoder& Handover() { return Op(kHandover, 0); }
  Encoder& Reap(uint8_t at) { return Op(kReap, at).U8(31); }
  Encoder& RndvData(uint8_t from, uint32_t len) {
    return Op(kRndvData, from)
        .U8(0)
        .Range(1, len)
        .U8(0)
        .U16(next_token_++)
        .U8(0);
  }
  // A message (or active message) from another node reaching `at`.
  Encoder& Frame(uint8_t at, bool am, uint32_t len, uint8_t tag,
                 bool rndv = false, bool sync = false) {
    Op(kFrame, at).U8(am ? 1 : 0).Len(len);
    if (!am) U8(rndv ? 3 : 0);
    U8(tag).U8(0).U16(next_token_++);
    return am ? U8(1).U8(0) : U8(sync ? 1 : 0);
  }
  Encoder& Am(uint8_t from, bool reply, uint32_t peer, uint32_t nargs,
              uint32_t payload, uint8_t flags) {
    Op(reply ? kAmReply : kAmRequest, from).Range(0, peer).U8(0).U8(1);
    Range(0, nargs).Len(payload).U16(next_token_++).U8(flags).U8(0);
    uint32_t len = nargs * shm::kAmArgBytes + payload;
    if (len <= shm::kInlineMax) {
      for (uint32_t i = 0; i < (len < 8 ? len : 8); i++) U8(i);
    }
    return *this;
  }

 private:
  std::vector<uint8_t> out_;
  uint16_t next_token_ = 1;
};

std::vector<std::vector<uint8_t>> Seeds() {
  std::vector<std::vector<uint8_t>> seeds;
  auto add = [&](const Encoder& e) { seeds.push_back(e.bytes()); };
  Encoder handover_rndv;  // added with the other handovers, in seed order
  // Eager, inline and pooled, expected and unexpected.
  add(Encoder().Send(0, 1, 1, 5).Turn().Recv(1, 0, 1, 64).Turn().Reap(1));
  add(Encoder().Recv(1, 0, 2, 9000).Turn().Send(0, 1, 2, 5000).Turn().Reap(1));
  add(Encoder()
          .Send(0, 1, 1, 3000)
          .Send(0, 1, 1, 20)
          .Turn()
          .Recv(1, 0xff, 1, 4000)
          .Recv(1, 0xff, 1, 4000)
          .Turn()
          .Reap(1)
          .Reap(0));
  // Sync send.
  add(Encoder()
          .Send(0, 2, 3, 100, true)
          .Turn()
          .Recv(2, 0, 3, 100)
          .Turn()
          .Reap(2)
          .Reap(0));
  // Rendezvous, in chunks; and with a handover between them (property 4).
  for (bool handover : {false, true}) {
    Encoder e;
    e.Send(0, 1, 1, 100000, false, true)
        .Turn()
        .Recv(1, 0, 1, 100000, false, false, 1)  // its bytes followed
        .Turn()
        .Reap(0)
        .RndvData(0, 60000);
    if (handover) e.Handover();
    e.Turn().Reap(1).RndvData(0, 40000).Turn().Reap(1);
    if (handover) {
      handover_rndv = e;
    } else {
      add(e);
    }
  }
  add(Encoder()
          .Recv(1, 0, 1, 5000)
          .Turn()
          .Send(0, 1, 1, 70000, false, true)
          .Turn()
          .Reap(0)
          .RndvData(0, 5000)
          .Turn()
          .Reap(1));
  // Probes: plain and claiming, eager and rendezvous.
  add(Encoder()
          .Send(2, 0, 0, 40)
          .Turn()
          .Recv(0, 0xff, 0, 0, true, false)
          .Recv(0, 0xff, 0, 0, true, true)
          .Turn()
          .Reap(0));
  add(Encoder()
          .Send(2, 0, 0, 30000, false, true)
          .Turn()
          .Recv(0, 2, 0, 0, true, true)
          .Turn()
          .Reap(0)
          .Op(kClaimedRecv, 0)
          .U8(0)
          .Len(30000)
          .U8(0)
          .U8(0)
          .Turn()
          .Reap(2)
          .RndvData(2, 30000)
          .Turn()
          .Reap(0));
  // Cancel.
  add(Encoder()
          .Recv(1, 0, 3, 10)
          .Turn()
          .Op(kCancel, 1)
          .U8(0)
          .U16(77)
          .U8(0)
          .Turn()
          .Reap(1));
  // Budget: many unexpected sends held, then drained.
  {
    Encoder e;
    for (int i = 0; i < 12; i++) e.Send(0, 1, 2, 4000);
    e.Turn();
    for (int i = 0; i < 12; i++) e.Recv(1, 0, 2, 4000).Turn().Reap(1);
    add(e);
  }
  // Active messages: request, reply, ack; to another job's endpoint too.
  add(Encoder()
          .Am(0, false, 1, 2, 100, shm::kAmWantsAck)
          .Turn()
          .Reap(1)
          .Am(1, true, 1, 1, 8, 0)
          .Op(kAmAck, 1)
          .Range(0, 1)
          .U64(0)
          .U8(0)
          .U8(1)
          .U8(0)
          .U8(1)
          .U8(0)
          .Turn()
          .Reap(0));
  add(Encoder().Am(0, true, 4, 0, 5000, 0).Turn().Reap(0).Reap(3));
  // Closing: removal with messages queued both ways, and a re-add.
  add(Encoder()
          .Send(0, 1, 1, 2000, true)
          .Send(1, 0, 1, 3000)
          .Turn()
          .Op(kRemove, 1)
          .Turn()
          .Reap(0)
          .Op(kReAdd, 1)
          .Send(0, 1, 1, 50)
          .Turn()
          .Recv(1, 0, 1, 64)
          .Turn()
          .Reap(1));
  add(Encoder()
          .Send(0, 1, 1, 90000, false, true)
          .Recv(1, 0, 1, 90000)
          .Turn()
          .Reap(0)
          .RndvData(0, 10000)
          .Op(kRemove, 1)
          .Turn()
          .Reap(0)
          .RndvData(0, 10000)
          .Turn());
  // Job B alone; a send to an unconnected slot.
  add(Encoder()
          .Send(3, 0, 1, 500)
          .Turn()
          .Recv(3, 0, 1, 500)
          .Turn()
          .Reap(3)
          .Send(3, 1, 1, 500)
          .Turn()
          .Reap(3));
  // A budget option, and a completion ring left full.
  {
    Encoder e;
    e.Op(kSetOption, 1).U8(10).U16(8).U16(1).U8(0);
    for (int i = 0; i < 20; i++) e.Send(0, 1, 0, 10);
    for (int i = 0; i < 20; i++) e.Recv(1, 0xff, 0, 10);
    e.Turn().Turn().Reap(1);
    add(e);
  }
  // The send arena wraps around with its chunk boundaries shifted by one
  // header: the last payload covers the header of a chunk of the first
  // round, released long before (property 2 must not count it).
  {
    Encoder e;
    for (uint32_t len :
         {8128, 8128, 8128, 8128, 8128, 8128, 8128, 8128, 8064, 100}) {
      e.Recv(1, 0, 1, 9000).Send(0, 1, 1, len).Turn().Reap(1);
    }
    add(e);
  }
  // Between nodes: messages and active messages from another node, eager,
  // pooled, synchronous and rendezvous, to endpoints of both shards; a
  // link to that node and sends on it, held and not; its loss.
  add(Encoder()
          .Frame(0, false, 5000, 1)
          .Frame(1, false, 20, 1, false, true)
          .Frame(2, true, 3000, 2)
          .Turn()
          .Recv(0, 0xff, 1, 9000)
          .Recv(1, 0xff, 1, 64)
          .Turn()
          .Reap(0)
          .Reap(1)
          .Reap(2)
          .Frame(1, false, 70000, 1, true)
          .Recv(1, 0xff, 1, 70000)
          .Turn()
          .Reap(1));
  add(Encoder()
          .Op(kRemoteLink, 1)
          .U8(0)
          .U8(0)
          .Op(kFabricHold, 0)
          .U8(1)
          .Send(1, 0, 1, 3000)
          .Send(1, 0, 1, 10, true)
          .Turn()
          .Op(kFabricHold, 0)
          .U8(0)
          .Turn()
          .Reap(1)
          .Recv(1, 0, 2, 100)
          .Op(kNodeEvent, 0)
          .U8(1)
          .U8(1)
          .Turn()
          .Reap(1)
          .Frame(0, false, 30, 3)
          .Op(kNodeEvent, 0)
          .U8(0)
          .U8(0)
          .Op(kRemove, 0)
          .Turn());
  // Handovers (property 4): mid-rendezvous, with sends held for a budget,
  // with a claimed message, and with completions left unreaped.
  add(handover_rndv);
  {
    // With the fabric: sends to the other node that it holds (with two
    // shards, position 0's and 2's wait on shard 0: held_fabric_); the
    // fabric takes them again after the load.
    Encoder e;
    e.Op(kRemoteLink, 0).U8(0).U8(0).Op(kRemoteLink, 2).U8(0).U8(0);
    e.Op(kFabricHold, 0).U8(1);
    for (int i = 0; i < 6; i++) {
      e.Send(0, 0, 3, i % 2 ? 3000 : 12).Send(2, 0, 3, 100, i == 5);
    }
    e.Turn().Handover().Op(kFabricHold, 0).U8(0).Turn().Reap(0).Reap(2);
    add(e);
  }
  {
    // Messages from the other node beyond their receiver's budget (16 KiB,
    // 128 messages): with two shards position 0's wait on its shard
    // (held_items_, kRemoteArrive).
    Encoder e;
    for (int i = 0; i < 140; i++) e.Frame(0, false, 16, 4);
    e.Turn().Handover();
    for (int i = 0; i < 8; i++) e.Recv(0, 0xff, 4, 64).Turn().Reap(0);
    add(e);
  }
  {
    Encoder e;
    for (int i = 0; i < 12; i++) e.Send(0, 1, 2, 4000);
    e.Turn().Handover();
    for (int i = 0; i < 12; i++) e.Recv(1, 0, 2, 4000).Turn().Reap(1);
    add(e);
  }
  add(Encoder()
          .Send(2, 0, 0, 30000, false, true)
          .Send(2, 0, 0, 40, true)
          .Turn()
          .Recv(0, 2, 0, 0, true, true)
          .Turn()
          .Handover()
          .Reap(0)
          .Op(kClaimedRecv, 0)
          .U8(0)
          .Len(30000)
          .U8(0)
          .U8(0)
          .Recv(0, 0xff, 0, 64)
          .Turn()
          .Handover()
          .Reap(2)
          .RndvData(2, 30000)
          .Turn()
          .Reap(0));
  {
    Encoder e;
    for (int i = 0; i < 20; i++) e.Send(0, 1, 0, 10);
    for (int i = 0; i < 20; i++) e.Recv(1, 0xff, 0, 10);
    e.Turn().Handover().Turn().Reap(1).Handover().Turn().Reap(1);
    add(e);
  }
  // Copies in place (property 5). Positions 0 and 1 are on two shards,
  // 0 and 2 on one. Taken over at once, the sender publishing a chunk
  // after it (released unread):
  add(Encoder()
          .CopyInPlace(0, false)
          .RndvSend(0, 1, 1, 100000, true)
          .Recv(1, 0, 1, 100000, false, false, 3)
          .Turn()
          .Reap(0)
          .Turn()
          .Advance(0, true)
          .Turn()
          .Reap(1)
          .Reap(0)
          .RndvData(0, 30000)
          .Turn());
  // Streamed, then stalled for copy_after: the rest placed.
  add(Encoder()
          .CopyInPlace(1, false)
          .RndvSend(0, 2, 2, 150000, true)
          .Recv(2, 0, 2, 150000, false, false, 3)
          .Turn()
          .Reap(0)
          .RndvData(0, 40000)
          .Turn()
          .Reap(2)
          .Advance(2, false)
          .Turn()
          .Advance(0, true)
          .Turn()
          .Reap(2)
          .Reap(0)
          .RndvData(0, 40000)
          .Turn());
  // Removed right after the takeover, while the copy may run: the
  // receiver (its shard cancels the copy), then the sender, on another
  // shard than the copy's (its removed flag stops it).
  add(Encoder()
          .CopyInPlace(0, false)
          .RndvSend(0, 2, 1, 200000, true)
          .Recv(2, 0, 1, 200000, false, false, 3)
          .Turn()
          .Op(kRemove, 2)
          .Turn()
          .Reap(0)
          .RndvSend(1, 0, 3, 200000, true)
          .Recv(0, 1, 3, 200000, false, false, 3)
          .Turn()
          .Op(kRemove, 1)
          .Turn()
          .Reap(0));
  // A cancelled receive that named its buffer; a handover while the copy
  // may run (the engines quiesce only once it ended).
  add(Encoder()
          .CopyInPlace(0, false)
          .Recv(1, 0, 5, 1000, false, false, 3)
          .Op(kCancel, 1)
          .U8(0)
          .U16(77)
          .U8(0)
          .RndvSend(0, 1, 1, 120000, true)
          .Recv(1, 0, 1, 120000, false, false, 3)
          .Turn()
          .Reap(0)
          .Turn()
          .Handover()
          .Turn()
          .Reap(1)
          .Reap(0));
  // Below the threshold: a stream. Above it: a transfer under way handed
  // over, taken over by the successor once stalled; one sender's messages
  // of one tag in order.
  add(Encoder()
          .CopyInPlace(2, true)
          .RndvSend(0, 2, 1, 30000, true)
          .Recv(2, 0, 1, 30000, false, false, 3)
          .Turn()
          .Reap(0)
          .RndvData(0, 30000)
          .Turn()
          .Reap(2)
          .RndvSend(0, 2, 1, 180000, true)
          .Recv(2, 0, 1, 180000, false, false, 3)
          .Turn()
          .Reap(0)
          .RndvData(0, 50000)
          .Turn()
          .Reap(2)
          .Handover()
          .Advance(20, false)
          .Turn()
          .Advance(0, true)
          .Turn()
          .Reap(2)
          .Reap(0));
  // A transfer between shards that awaits kSendDone, handed over mid-stream:
  // the successor streams it to its end (its sender is not known to it
  // until a new go); on one engine it takes the rest over.
  add(Encoder()
          .CopyInPlace(2, false)
          .RndvSend(0, 1, 1, 150000, true)
          .Recv(1, 0, 1, 150000, false, false, 3)
          .Turn()
          .Reap(0)
          .RndvData(0, 50000)
          .Turn()
          .Reap(1)
          .Handover()
          .Advance(30, false)
          .Turn()
          .Advance(0, true)
          .Turn()
          .Reap(1)
          .Reap(0)
          .RndvData(0, 50000)
          .Turn()
          .Reap(1)
          .RndvData(0, 50000)
          .Turn()
          .Reap(1)
          .Reap(0));
  return seeds;
}

}  // namespace
}  // namespace psmd

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  if (const char* dir = getenv("ENGINE_FUZZ_WRITE_SEEDS")) {
    int i = 0;
    for (const auto& seed : psmd::Seeds()) {
      char name[32];
      snprintf(name, sizeof(name), "/seed-%02d", i++);
      std::ofstream(std::string(dir) + name, std::ios::binary)
          .write(reinterpret_cast<const char*>(seed.data()),
                 static_cast<std::streamsize>(seed.size()));
    }
    printf("engine_fuzz: wrote %d seeds to %s\n", i, dir);
    exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (uint32_t shards = 1; shards <= 2; shards++) {
    psmd::Reader in(data, size);
    psmd::Node node(shards);
    node.Run(in);
  }
  return 0;
}
