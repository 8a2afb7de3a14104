#include "tests/conformance/pair.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "tests/programs/rendezvous.h"

namespace psmd::conformance {
namespace {

bool g_case_failed = false;
const char* g_case_name = "";

bool FileExists(const std::string& path) {
  return access(path.c_str(), F_OK) == 0;
}

}  // namespace

void Check(bool ok, const char* expr, const char* file, int line) {
  if (ok) return;
  g_case_failed = true;
  fprintf(stderr, "%s:%d: case %s: check failed: %s\n", file, line, g_case_name,
          expr);
}

bool Pair::OneNode() const {
  return impl == "intel" ||
         psm2_epid_nid(self_epid) == psm2_epid_nid(peer_epid);
}

void Pair::Barrier(const std::string& name) {
  int seq = barrier_seq++;
  std::string base = dir + "/barrier." + std::to_string(seq) + ".";
  std::ofstream(base + std::to_string(rank)).put('\n');
  std::string other = base + std::to_string(1 - rank);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!FileExists(other)) {
    psm2_poll(ep);
    if (std::chrono::steady_clock::now() > deadline) {
      fprintf(stderr,
              "rank %d: barrier %d (%s) timed out: the peer never arrived\n",
              rank, seq, name.c_str());
      exit(3);
    }
    usleep(50);
  }
}

int RunCases(int argc, char** argv, const std::vector<Case>& cases) {
  Pair pair;
  std::string only;
  std::string uuid_text = "c0ffee00c0ffee00c0ffee00c0ffee00";
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", arg.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (arg == "--rank") {
      pair.rank = atoi(value().c_str());
    } else if (arg == "--dir") {
      pair.dir = value();
    } else if (arg == "--uuid") {
      uuid_text = value();
    } else if (arg == "--case") {
      only = value();
    } else if (arg == "--list") {
      for (const Case& c : cases) printf("%s\n", c.name.c_str());
      return 0;
    } else {
      fprintf(
          stderr,
          "unknown argument %s\nusage: %s --rank 0|1 --dir DIR [--uuid HEX] "
          "[--case NAME] [--list]\n",
          arg.c_str(), argv[0]);
      return 2;
    }
  }
  if (pair.dir.empty() || (pair.rank != 0 && pair.rank != 1)) {
    fprintf(stderr, "%s: --rank 0|1 and --dir DIR are required\n", argv[0]);
    return 2;
  }
  const char* impl = getenv("PSMD_CONFORMANCE_IMPL");
  pair.impl = impl ? impl : "psmd";

  psm2_uuid_t uuid;
  if (!psmd::testing::ParseUuid(uuid_text, uuid)) {
    fprintf(stderr, "bad --uuid %s\n", uuid_text.c_str());
    return 2;
  }
  psmd::testing::ConnectedPair c =
      psmd::testing::OpenAndConnect(uuid, pair.dir, pair.rank);
  pair.ep = c.ep;
  pair.mq = c.mq;
  pair.self_epid = c.self_epid;
  pair.peer_epid = c.peer_epid;
  pair.peer = c.peer;
  pair.Barrier("connected");

  int failed = 0, ran = 0;
  for (const Case& c : cases) {
    if (!only.empty() && c.name != only) continue;
    g_case_name = c.name.c_str();
    g_case_failed = false;
    c.fn(pair);
    pair.Barrier(c.name);
    ran++;
    if (g_case_failed) failed++;
    printf("%s rank%d %s\n", g_case_failed ? "FAIL" : "PASS", pair.rank,
           c.name.c_str());
    fflush(stdout);
  }
  if (ran == 0) {
    fprintf(stderr, "no case named %s\n", only.c_str());
    return 2;
  }
  pair.Barrier("done");
  psm2_mq_finalize(pair.mq);
  psm2_ep_close(pair.ep, PSM2_EP_CLOSE_GRACEFUL, 2 * 1000000000LL);
  psm2_finalize();
  return failed == 0 ? 0 : 1;
}

}  // namespace psmd::conformance
