// am_fanin: Active Message ordering with several initiators (psm2_am.h: "the
// order in which AM requests are issued by an initiator to a particular
// target defines the order in which those AM requests will be executed on
// that target ... for multiple initiators ... the handler executions will be
// interleaved in some sequentially consistent ordering").
//
//   am_fanin --rank R --dir DIR --ranks N [--uuid HEX] [--count C]
//
// Run with run_pair.sh --ranks 3 (N >= 3). Ranks 1..N-1 each send C requests
// to rank 0 while rank 0 sends C requests to each of them, all at once.
// Every request carries its sender's rank and a sequence number (and a
// payload of varying length derived from both). Each handler checks that the
// source epaddr (psm2_am_get_source) matches the claimed sender, that every
// flow arrives complete and in issue order, and the payload bytes;
// interleaving across flows is allowed (and counted). Exit status 0 only if
// every check passed on this rank; rank 0 prints PASS/FAIL.
#include <psm2.h>
#include <psm2_am.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tests/programs/rendezvous.h"

namespace {

using psmd::testing::CheckPsm;

struct Flow {
  psm2_epaddr_t addr = nullptr;  // the peer (nullptr for this rank itself)
  uint64_t received = 0;  // requests from it so far = the next expected seq
  uint64_t out_of_order = 0;
  uint64_t bad_payloads = 0;
};

struct Job {
  int rank = -1;
  int ranks = 0;
  std::string dir;
  psm2_ep_t ep = nullptr;
  std::vector<Flow> flows;  // indexed by rank
  uint64_t wrong_source = 0;
  uint64_t flow_switches = 0;  // consecutive handler runs from different flows
  int last_flow = -1;
  int barrier_seq = 0;
};
Job g_job;

uint8_t PayloadByte(uint64_t sender, uint64_t seq, size_t j) {
  return static_cast<uint8_t>(sender * 89 + seq * 7 + j * 13);
}
uint32_t PayloadLen(uint64_t seq) {
  return static_cast<uint32_t>((seq * 29) % 97);
}

// args[0] = sender rank, args[1] = sequence number in the sender's flow to
// this target.
int FlowHandler(psm2_am_token_t token, psm2_amarg_t* args, int nargs, void* src,
                uint32_t len) {
  Job& job = g_job;
  psm2_epaddr_t source = nullptr;
  psm2_am_get_source(token, &source);
  uint64_t sender = nargs >= 2 ? args[0].u64 : ~0ULL;
  if (sender >= static_cast<uint64_t>(job.ranks) ||
      job.flows[sender].addr == nullptr || job.flows[sender].addr != source) {
    job.wrong_source++;
    return 0;
  }
  Flow& flow = job.flows[sender];
  uint64_t seq = args[1].u64;
  if (seq != flow.received) flow.out_of_order++;
  if (len != PayloadLen(seq)) {
    flow.bad_payloads++;
  } else {
    const auto* b = static_cast<const uint8_t*>(src);
    for (uint32_t j = 0; j < len; j++) {
      if (b[j] != PayloadByte(sender, seq, j)) {
        flow.bad_payloads++;
        break;
      }
    }
  }
  flow.received++;
  if (job.last_flow >= 0 && job.last_flow != static_cast<int>(sender))
    job.flow_switches++;
  job.last_flow = static_cast<int>(sender);
  return 0;
}

// All ranks return once every rank has reached its n-th barrier; polls while
// waiting. (Like Pair::Barrier, it does not deliver messages sent before it:
// completion is judged by counts.)
void Barrier(Job& job) {
  int seq = job.barrier_seq++;
  std::string base = job.dir + "/fanin_barrier." + std::to_string(seq) + ".";
  std::ofstream(base + std::to_string(job.rank)).put('\n');
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int r = 0; r < job.ranks; r++) {
    std::string path = base + std::to_string(r);
    while (access(path.c_str(), F_OK) != 0) {
      psm2_poll(job.ep);
      if (std::chrono::steady_clock::now() > deadline) {
        fprintf(stderr,
                "am_fanin rank %d: barrier %d timed out waiting for rank %d\n",
                job.rank, seq, r);
        exit(3);
      }
      usleep(50);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Job& job = g_job;
  std::string uuid_text = "fa11f00dfa11f00dfa11f00dfa11f00d";
  uint64_t count = 10000;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (i + 1 >= argc) {
      fprintf(stderr, "%s needs a value\n", arg.c_str());
      return 2;
    }
    std::string value = argv[++i];
    if (arg == "--rank") {
      job.rank = atoi(value.c_str());
    } else if (arg == "--ranks") {
      job.ranks = atoi(value.c_str());
    } else if (arg == "--dir") {
      job.dir = value;
    } else if (arg == "--uuid") {
      uuid_text = value;
    } else if (arg == "--count") {
      count = strtoull(value.c_str(), nullptr, 10);
    } else {
      fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  psm2_uuid_t uuid;
  if (job.ranks < 3 || job.rank < 0 || job.rank >= job.ranks ||
      job.dir.empty() || !psmd::testing::ParseUuid(uuid_text, uuid)) {
    fprintf(stderr,
            "usage: am_fanin --rank R --dir DIR --ranks N (N >= 3; run_pair.sh "
            "--ranks N) "
            "[--uuid HEX] [--count C]\n");
    return 2;
  }

  psm2_epid_t self_epid;
  psmd::testing::InitAndOpen(uuid, &job.ep, &self_epid);
  if (!psmd::testing::PublishEpid(job.dir, job.rank, self_epid)) return 2;

  // Rank 0 talks to everyone; the others talk to rank 0 only.
  std::vector<int> peers;
  if (job.rank == 0) {
    for (int r = 1; r < job.ranks; r++) peers.push_back(r);
  } else {
    peers.push_back(0);
  }
  std::vector<psm2_epid_t> epids(peers.size());
  for (size_t i = 0; i < peers.size(); i++) {
    if (!psmd::testing::AwaitEpid(job.dir, peers[i], 30, &epids[i])) {
      fprintf(stderr, "am_fanin rank %d: no epid from rank %d\n", job.rank,
              peers[i]);
      return 2;
    }
  }
  std::vector<psm2_error_t> errs(peers.size());
  std::vector<psm2_epaddr_t> addrs(peers.size());
  CheckPsm(
      psm2_ep_connect(job.ep, static_cast<int>(peers.size()), epids.data(),
                      nullptr, errs.data(), addrs.data(), 30 * 1000000000LL),
      "psm2_ep_connect");
  job.flows.resize(static_cast<size_t>(job.ranks));
  for (size_t i = 0; i < peers.size(); i++) job.flows[peers[i]].addr = addrs[i];

  psm2_am_handler_fn_t handlers[] = {FlowHandler};
  int idx[1];
  CheckPsm(psm2_am_register_handlers(job.ep, handlers, 1, idx),
           "psm2_am_register_handlers");
  Barrier(job);  // every rank has registered: requests may flow
  // Rank 0 stays out of the library for a moment, so that the flows queue up
  // at it concurrently and their handler runs interleave (not required, but
  // otherwise a fast sender often finishes before the other starts).
  if (job.rank == 0) usleep(20 * 1000);

  // Round robin over this rank's peers; every request is numbered within its
  // flow. Polls now and then so that incoming requests run while sending.
  std::vector<uint64_t> sent(peers.size(), 0);
  std::vector<uint8_t> payload(128);
  bool send_failed = false;
  for (uint64_t seq = 0; seq < count && !send_failed; seq++) {
    for (size_t i = 0; i < peers.size(); i++) {
      uint32_t len = PayloadLen(seq);
      for (uint32_t j = 0; j < len; j++)
        payload[j] = PayloadByte(job.rank, seq, j);
      psm2_amarg_t args[2];
      args[0].u64 = static_cast<uint64_t>(job.rank);
      args[1].u64 = seq;
      int flags = (seq % 2) ? PSM2_AM_FLAG_NOREPLY : PSM2_AM_FLAG_NONE;
      psm2_error_t err =
          psm2_am_request_short(addrs[i], idx[0], args, 2, payload.data(), len,
                                flags, nullptr, nullptr);
      if (err != PSM2_OK) {
        fprintf(stderr, "am_fanin rank %d: request %llu to rank %d: %s\n",
                job.rank, static_cast<unsigned long long>(seq), peers[i],
                psm2_error_get_string(err));
        send_failed = true;
        break;
      }
      sent[i]++;
    }
    if (seq % 16 == 0) psm2_poll(job.ep);
  }

  // Wait until every flow into this rank is complete.
  auto all_in = [&] {
    for (int p : peers) {
      if (job.flows[p].received < count) return false;
    }
    return true;
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!all_in() && std::chrono::steady_clock::now() < deadline)
    psm2_poll(job.ep);
  Barrier(job);  // nobody closes while another rank still needs it

  bool ok = !send_failed && all_in() && job.wrong_source == 0;
  for (int p : peers) {
    const Flow& f = job.flows[p];
    ok =
        ok && f.received == count && f.out_of_order == 0 && f.bad_payloads == 0;
    if (f.received != count || f.out_of_order || f.bad_payloads) {
      fprintf(stderr,
              "am_fanin rank %d: flow from rank %d: %llu of %llu requests, "
              "%llu out of order, "
              "%llu bad payloads\n",
              job.rank, p, static_cast<unsigned long long>(f.received),
              static_cast<unsigned long long>(count),
              static_cast<unsigned long long>(f.out_of_order),
              static_cast<unsigned long long>(f.bad_payloads));
    }
  }
  if (job.wrong_source) {
    fprintf(stderr,
            "am_fanin rank %d: %llu requests whose source did not match their "
            "sender\n",
            job.rank, static_cast<unsigned long long>(job.wrong_source));
  }
  if (job.rank == 0) {
    printf(
        "%s rank0 am_fanin: %d flows x %llu requests in, %llu out to each; "
        "%llu flow "
        "switches\n",
        ok ? "PASS" : "FAIL", job.ranks - 1,
        static_cast<unsigned long long>(count),
        static_cast<unsigned long long>(count),
        static_cast<unsigned long long>(job.flow_switches));
  } else {
    printf("%s rank%d am_fanin\n", ok ? "PASS" : "FAIL", job.rank);
  }
  fflush(stdout);

  psm2_am_unregister_handlers(job.ep);
  psm2_ep_close(job.ep, PSM2_EP_CLOSE_GRACEFUL, 2 * 1000000000LL);
  psm2_finalize();
  return ok ? 0 : 1;
}
