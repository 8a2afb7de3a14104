// engine_scale: what one matching engine costs per message, and how engines
// on separate threads scale, in one process and without client processes.
//
// Each worker thread owns an MqEngine with its own job and `--pairs` pairs
// of endpoints whose segments are in memory, as mq_engine_test builds them
// (real rings, a real job pool). The thread plays both roles in turn:
//   client: for every pair, publishes `--window` receives on the receiver's
//           control ring, then as many sends on the sender's message ring
//           (8 B inline, or 4 KiB in the job pool, copied in by the
//           "client"), all matching in order;
//   engine: PollAll until every receive completed, timed with the
//           thread's CPU clock around each call (two syscalls per call of
//           `pairs` x `window` messages: a few ns per message);
//   client: reaps both completion rings and releases pool chunks.
// msgs_per_s counts completed receives of all workers over the wall time
// (client work included, and whatever else the machine runs); ns_per_msg
// is the engines' CPU time only, per message: the worker's CPU cost per
// matched message; cpu_util is the process's CPU time over the wall time
// (2.0 = two cores busy).
//
// With more than one worker the engines are shards of one psmd: one job
// spans them, ids place endpoints as the registry does (MqEngine::ShardOf),
// and they are joined by a Crossing (daemon/engine/crossing.h). --cross P
// puts the receiver of P% of each worker's pairs on the next worker's
// shard: those messages cross a lane and arrive there through Arrive, and
// their completions are reaped by the sending worker's thread (its
// "client"). Each thread polls its own engine only, as a psmd worker does.
//
// Usage: engine_scale [--seconds S] [--pairs P] [--window W] [--cpus A,B]
//                     [--workers N] [--size BYTES] [--feeder self|thread]
//                     [--cross PERCENT] [--threads one]
// --threads one drives every shard from one thread, in turn: no cache line
// moves between cores and no thread waits for another to be scheduled, so
// ns_per_msg (and Ir/msg under callgrind) is the shards' own work per
// message, crossing included.
// With --feeder thread, each worker's clients are a second thread on the
// next CPU of --cpus: the rings' cache lines then move between cores as
// with client processes, and ns_per_msg includes those misses.
// Without --workers/--size it runs workers 1 and 2 at 8 B and 4 KiB. Under
// valgrind --tool=callgrind --collect-atstart=no, only the engine's calls
// are collected, so Ir / messages is the engine's instructions per message.
#include <psm2.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <valgrind/callgrind.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/engine/mq_engine.h"
#include "daemon/engine/test_endpoint.h"
#include "shm/payload.h"
#include "shm/pool.h"
#include "shm/segment.h"

namespace psmd {
namespace {

constexpr uint32_t kRingCapacity = 256;
constexpr uint64_t kRegionBytes = 4 << 20;
constexpr uint64_t kBudget = 1 << 30;

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "engine_scale: %s\n", why.c_str());
  std::exit(1);
}

struct Options {
  double seconds = 2.0;
  uint32_t pairs = 4;
  uint32_t window = 32;
  std::vector<int> cpus = {0, 1};
  int workers = 0;      // 0: 1 and 2
  bool feeder = false;  // the clients' half on its own thread and core
  uint32_t size = 0;    // 0: 8 and 4096
  int cross = -1;       // -1: 0 and 50 (with 2 workers)
  bool one_thread = false;
};

// This thread's CPU time: what the engine spent, not the wall time a
// preempted thread waited (the machine may be shared).
uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

// One endpoint as its client sees it.
struct ClientSide {
  uint32_t id = 0;
  shm::ClientRings rings;
  shm::SendArena arena;
};

// The engines of one run: shards of one psmd when there are several.
struct Node {
  Node(int workers, uint32_t endpoints) : crossing(workers) {
    std::string error;
    shm::Mapping pool;
    if (!shm::Mapping::Create("engine-scale-pool", endpoints * kRegionBytes,
                              geteuid(), getegid(), &pool, &error))
      Die(error);
    job = std::make_shared<Job>(JobKey{Uuid{1}, geteuid()}, std::move(pool),
                                endpoints, kRegionBytes,
                                std::make_shared<UidAccount>());
    for (int w = 0; w < workers; w++) {
      engines.push_back(std::make_unique<MqEngine>(kBudget, kBudget, kBudget));
      if (workers > 1) engines.back()->JoinShards(&crossing, w);
      next_id.push_back(static_cast<uint32_t>(workers + w));
    }
  }
  // An id of shard `w` (MqEngine::ShardOf), as the registry hands them out.
  uint32_t NewId(int w) {
    const uint32_t id = next_id[w];
    next_id[w] += static_cast<uint32_t>(engines.size());
    return id;
  }

  Crossing crossing;
  std::shared_ptr<Job> job;  // one job over every shard
  std::vector<std::unique_ptr<MqEngine>> engines;
  std::vector<uint32_t> next_id;
  // Threads still running rounds: a thread that is done keeps polling its
  // engine until none is, for the others' messages to its receivers.
  std::atomic<int> running{0};
};

// One worker's pairs and the thread that drives them: its engine's
// PollAll, and the clients of its pairs (senders on its shard, receivers
// on its shard or, for --cross, the next one).
class Shard {
 public:
  Shard(int index, const Options& o, uint32_t size, Node& node, int cross)
      : o_(o),
        size_(size),
        payload_(size, 'p'),
        node_(node),
        engine_(*node.engines[index]) {
    const int workers = static_cast<int>(node.engines.size());
    const uint32_t cross_pairs = o.pairs * static_cast<uint32_t>(cross) / 100;
    // Pair p: endpoint 2p sends to 2p+1, each naming the other at slot 0.
    for (uint32_t p = 0; p < o.pairs; p++) {
      const int rx_shard = p < cross_pairs ? (index + 1) % workers : index;
      Add(index);
      Add(rx_shard);
      ClientSide& tx = clients_[2 * p];
      ClientSide& rx = clients_[2 * p + 1];
      node.engines[index]->SetPeer(tx.id, 0, PeerLink{rx.id, 0x1000 + rx.id});
      node.engines[rx_shard]->SetPeer(rx.id, 0,
                                      PeerLink{tx.id, 0x1000 + tx.id});
    }
  }

  // Runs rounds until `stop`; returns after the last round completed and
  // every other thread's did.
  void Run(const std::atomic<bool>& stop) {
    node_.running.fetch_add(1);
    while (!stop.load(std::memory_order_relaxed)) {
      const uint64_t want = Publish();
      uint32_t idle = 0;
      while (messages_ < want) {
        const bool did = Poll();
        Reap();
        // Alone, an engine that does nothing is stuck; with shards, this
        // one may wait for another's.
        idle = did ? 0 : idle + 1;
        if (node_.engines.size() == 1 && idle > 0 && messages_ < want)
          Die("the engine stopped short");
        if (idle > (1u << 26)) Die("the shards stopped short");
      }
    }
    node_.running.fetch_sub(1);
    while (node_.running.load() > 0) Poll();
  }

  // --threads one: a round of this shard's pairs published (returns the
  // count at which it is complete), and one turn of its engine and clients.
  uint64_t PublishRound() { return Publish(); }
  bool Step() {
    const bool did = Poll();
    Reap();
    return did;
  }

  // --feeder: the client's half, on another thread (and core): it publishes
  // a round and reaps it while RunEngine polls.
  void RunFeeder(const std::atomic<bool>& stop) {
    while (!stop.load(std::memory_order_relaxed)) {
      const uint64_t want = Publish();
      while (messages_ < want && !stop.load(std::memory_order_relaxed)) Reap();
    }
    done_.store(true, std::memory_order_release);
  }
  // The engine's half: polls until the feeder is done. Calls that found
  // nothing to do are not counted as the engine's time: that is waiting.
  void RunEngine() {
    while (!done_.load(std::memory_order_acquire)) Poll();
  }

  uint64_t messages() const { return messages_; }
  uint64_t engine_ns() const { return engine_ns_; }

 private:
  // An endpoint on shard `w`, its client driven by this thread.
  void Add(int w) {
    const uint32_t id = node_.NewId(w);
    auto ep = MakeTestEndpoint(node_.job, *node_.job->TakeRegion(), id,
                               0x1000 + id, kRingCapacity, kBudget);
    ClientSide c;
    c.id = id;
    c.rings = shm::ClientRingsOf(ep->segment().base(), ep->geometry());
    c.arena = shm::SendArena(node_.job->pool().base(), ep->region().offset,
                             ep->region().bytes);
    clients_.push_back(c);
    endpoints_.push_back(ep);
    node_.engines[w]->Add(ep);
  }

  // Publishes a round of receives and sends; returns the message count
  // at which it is complete.
  uint64_t Publish() {
    const uint32_t tag_sel[3] = {~0u, ~0u, ~0u};
    for (uint32_t p = 0; p < o_.pairs; p++) {
      ClientSide& tx = clients_[2 * p];
      ClientSide& rx = clients_[2 * p + 1];
      for (uint32_t i = 0; i < o_.window; i++) {
        const uint32_t tag[3] = {i, 0, 0};
        if (!rx.rings.ctl_sq.TryPush(
                shm::PrepRecv(0, next_token_++, tag, tag_sel, size_)))
          Die("receive ring full");
      }
      for (uint32_t i = 0; i < o_.window; i++) {
        const uint32_t tag[3] = {i, 0, 0};
        shm::SubmissionDesc d =
            shm::PrepSend(0, next_token_++, tag, size_, false);
        if (shm::PayloadInPool(d)) {
          auto off = tx.arena.Allocate(size_);
          if (!off) Die("send arena full");
          std::memcpy(node_.job->pool().base() + *off, payload_.data(), size_);
          d.body.pool.pool_offset = *off;
        } else {
          std::memcpy(d.body.inline_data, payload_.data(), size_);
        }
        if (!tx.rings.msg_sq.TryPush(d)) Die("message ring full");
      }
    }
    return messages_ + uint64_t{o_.pairs} * o_.window;
  }

  // One PollAll, its CPU time counted when it did something.
  bool Poll() {
    const uint64_t t0 = ThreadCpuNs();
    CALLGRIND_TOGGLE_COLLECT;
    const bool did = engine_.PollAll();
    CALLGRIND_TOGGLE_COLLECT;
    if (did) engine_ns_ += ThreadCpuNs() - t0;
    return did;
  }

  void Reap() {
    shm::CompletionDesc c;
    for (ClientSide& cs : clients_) {
      while (cs.rings.cq.PopBatch(&c, 1) == 1) {
        if (c.op != shm::CompleteOp::kRecvDone) continue;
        if (c.error != PSM2_OK || c.msg_len != size_)
          Die("a receive completed wrong");
        // Releases the chunk, as a client does once it copied the bytes.
        shm::PoolPayload chunk = shm::PayloadOf(node_.job->pool().base(), c);
        messages_++;
      }
    }
  }

  const Options& o_;
  const uint32_t size_;
  const std::string payload_;
  Node& node_;
  MqEngine& engine_;
  std::vector<std::shared_ptr<Endpoint>> endpoints_;
  std::vector<ClientSide> clients_;
  uint64_t next_token_ = 1;
  uint64_t messages_ = 0;   // the reaping thread's
  uint64_t engine_ns_ = 0;  // the polling thread's
  std::atomic<bool> done_{false};
};

void Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0)
    Die("cannot pin a worker to CPU " + std::to_string(cpu));
}

void RunOne(const Options& o, int workers, uint32_t size, int cross) {
  Node node(workers, 2 * o.pairs * static_cast<uint32_t>(workers));
  std::vector<std::unique_ptr<Shard>> shards;
  for (int w = 0; w < workers; w++)
    shards.push_back(std::make_unique<Shard>(w, o, size, node, cross));
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  std::string placement;
  rusage before;
  getrusage(RUSAGE_SELF, &before);
  const double cpu_before =
      before.ru_utime.tv_sec + before.ru_stime.tv_sec +
      (before.ru_utime.tv_usec + before.ru_stime.tv_usec) / 1e6;
  const auto start = std::chrono::steady_clock::now();
  if (o.one_thread) {
    placement = std::to_string(o.cpus[0]) + " (one thread)";
    threads.emplace_back([&stop, &shards, cpu = o.cpus[0]] {
      Pin(cpu);
      std::vector<uint64_t> want(shards.size());
      while (!stop.load(std::memory_order_relaxed)) {
        for (size_t w = 0; w < shards.size(); w++)
          want[w] = shards[w]->PublishRound();
        for (bool short_of = true; short_of;) {
          bool did = false;
          short_of = false;
          for (size_t w = 0; w < shards.size(); w++) {
            did |= shards[w]->Step();
            short_of |= shards[w]->messages() < want[w];
          }
          if (short_of && !did) Die("the shards stopped short");
        }
      }
    });
  }
  for (int w = 0; w < workers && !o.one_thread; w++) {
    const int cpu = o.cpus[(o.feeder ? 2 * w : w) % o.cpus.size()];
    placement += (w ? "," : "") + std::to_string(cpu);
    Shard& shard = *shards[w];
    if (!o.feeder) {
      threads.emplace_back([&stop, &shard, cpu] {
        Pin(cpu);
        shard.Run(stop);
      });
      continue;
    }
    const int feeder_cpu = o.cpus[(2 * w + 1) % o.cpus.size()];
    placement += "+feeder:" + std::to_string(feeder_cpu);
    threads.emplace_back([&shard, cpu] {
      Pin(cpu);
      shard.RunEngine();
    });
    threads.emplace_back([&stop, &shard, feeder_cpu] {
      Pin(feeder_cpu);
      shard.RunFeeder(stop);
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds));
  stop = true;
  for (auto& t : threads) t.join();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const double cpu = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
                     (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6 -
                     cpu_before;
  uint64_t msgs = 0, engine_ns = 0;
  for (const auto& s : shards) {
    msgs += s->messages();
    engine_ns += s->engine_ns();
  }
  std::printf(
      "workers=%d cross=%d size=%u msgs_per_s=%.0f ns_per_msg=%.1f "
      "msgs=%llu cpu_util=%.2f cpus=%s\n",
      workers, cross, size, msgs / wall, msgs ? double(engine_ns) / msgs : 0.0,
      static_cast<unsigned long long>(msgs), cpu / wall, placement.c_str());
  std::fflush(stdout);
}

std::vector<int> ParseCpus(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p;) {
    char* end;
    out.push_back(static_cast<int>(std::strtol(p, &end, 10)));
    if (end == p) Die(std::string("bad --cpus: ") + s);
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

}  // namespace
}  // namespace psmd

int main(int argc, char** argv) {
  psmd::Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--seconds") {
      o.seconds = std::atof(v);
    } else if (k == "--pairs") {
      o.pairs = static_cast<uint32_t>(std::atoi(v));
    } else if (k == "--window") {
      o.window = static_cast<uint32_t>(std::atoi(v));
    } else if (k == "--cpus") {
      o.cpus = psmd::ParseCpus(v);
    } else if (k == "--workers") {
      o.workers = std::atoi(v);
    } else if (k == "--feeder") {
      o.feeder = std::string(v) == "thread";
    } else if (k == "--size") {
      o.size = static_cast<uint32_t>(std::atoi(v));
    } else if (k == "--cross") {
      o.cross = std::atoi(v);
    } else if (k == "--threads") {
      o.one_thread = std::string(v) == "one";
    } else {
      psmd::Die("unknown option " + k);
    }
  }
  if (argc % 2 == 0) psmd::Die("options take a value");
  if (o.pairs == 0 || o.window == 0 || o.window > psmd::kRingCapacity)
    psmd::Die("--pairs must be > 0 and --window in 1..256");
  std::printf(
      "# engine_scale: %u pairs per worker, %u matched messages per pair "
      "and round (receives posted first), fed by %s; "
      "ns_per_msg = engine time / messages; %.1f s per line\n",
      o.pairs, o.window,
      o.feeder ? "a feeder thread per worker" : "the worker thread itself",
      o.seconds);
  const std::vector<int> workers =
      o.workers ? std::vector<int>{o.workers} : std::vector<int>{1, 2};
  const std::vector<uint32_t> sizes =
      o.size ? std::vector<uint32_t>{o.size} : std::vector<uint32_t>{8, 4096};
  if (o.feeder && o.cross > 0) psmd::Die("--cross needs --feeder self");
  for (uint32_t size : sizes) {
    for (int w : workers) {
      // Crossing needs two shards; with the defaults, 0% and 50%.
      std::vector<int> crosses =
          o.cross >= 0 ? std::vector<int>{o.cross} : std::vector<int>{0, 50};
      if (w == 1 || o.feeder) crosses = {0};
      for (int cross : crosses) psmd::RunOne(o, w, size, cross);
    }
  }
  return 0;
}
