// ep_open: what joining a job costs a process, and what an attached but
// idle process costs psmd.
//
//   ep_open --rank 0|1 --dir DIR [--iters N] [--uuid HEX]
//       rank 1 opens an endpoint, publishes its epid and waits (in
//       psm2_mq_wait, which serves the connects) for rank 0's last message.
//       Rank 0 runs N fresh processes that each time psm2_init,
//       psm2_ep_open, a psm2_ep_connect to rank 1 and psm2_ep_close, and
//       prints the median, min and max of each.
//   ep_open idle --seconds S [--uuid HEX]
//       opens an endpoint, connects it to itself and sleeps S seconds
//       without calling the library: the idle client of
//       scripts/bench.sh's idle-CPU measurement.
//
// Works on psmd's libpsm2.so.2 and on Intel's alike (choose with
// LD_LIBRARY_PATH).
#include <psm2.h>
#include <psm2_mq.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/programs/rendezvous.h"

using psmd::testing::CheckPsm;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kTimeoutNs = 30'000'000'000LL;

// Runs f and returns how long it took, microseconds.
template <typename F>
double Micros(F f) {
  auto start = Clock::now();
  f();
  return std::chrono::duration<double, std::micro>(Clock::now() - start)
      .count();
}

void PrintStats(const char* what, std::vector<double> us) {
  std::sort(us.begin(), us.end());
  printf("%s median %.1f us min %.1f max %.1f (%zu)\n", what, us[us.size() / 2],
         us.front(), us.back(), us.size());
}

psm2_epaddr_t Connect(psm2_ep_t ep, psm2_epid_t peer) {
  psm2_epaddr_t addr;
  psm2_error_t err;
  CheckPsm(psm2_ep_connect(ep, 1, &peer, nullptr, &err, &addr, kTimeoutNs),
           "psm2_ep_connect");
  return addr;
}

void Open(const psm2_uuid_t uuid, psm2_ep_t* ep, psm2_epid_t* epid) {
  CheckPsm(psm2_ep_open(uuid, nullptr, ep, epid), "psm2_ep_open");
}

int Rank1(const psm2_uuid_t uuid, const std::string& dir) {
  psm2_ep_t ep;
  psm2_epid_t epid;
  psm2_mq_t mq = psmd::testing::InitOpenWithMq(uuid, &ep, &epid);
  psm2_mq_tag_t tag{}, sel{};
  char done;
  psm2_mq_req_t req;
  CheckPsm(psm2_mq_irecv2(mq, PSM2_MQ_ANY_ADDR, &tag, &sel, 0, &done, 1,
                          nullptr, &req),
           "psm2_mq_irecv2");
  if (!psmd::testing::PublishEpid(dir, 1, epid)) {
    fprintf(stderr, "ep_open: cannot publish the epid in %s\n", dir.c_str());
    return 2;
  }
  CheckPsm(psm2_mq_wait2(&req, nullptr), "psm2_mq_wait2");
  psm2_mq_finalize(mq);
  psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, kTimeoutNs);
  psm2_finalize();
  return 0;
}

// One process's init, open, connect to `peer` and close, microseconds.
struct Cycle {
  double init, open, connect, close;
};

Cycle OneCycle(const psm2_uuid_t uuid, psm2_epid_t peer) {
  Cycle c;
  int major = PSM2_VERNO_MAJOR, minor = PSM2_VERNO_MINOR;
  c.init = Micros([&] { CheckPsm(psm2_init(&major, &minor), "psm2_init"); });
  psm2_ep_t ep;
  psm2_epid_t epid;
  c.open = Micros([&] { Open(uuid, &ep, &epid); });
  c.connect = Micros([&] { Connect(ep, peer); });
  c.close = Micros([&] {
    CheckPsm(psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, kTimeoutNs),
             "psm2_ep_close");
  });
  psm2_finalize();
  return c;
}

int Rank0(const psm2_uuid_t uuid, const std::string& dir, int iters) {
  psm2_epid_t peer;
  if (!psmd::testing::AwaitEpid(dir, 1, 60, &peer)) {
    fprintf(stderr, "ep_open: no epid from rank 1 in %s\n", dir.c_str());
    return 2;
  }
  // Each cycle in a child of its own: Intel's libpsm2 cannot connect a
  // second endpoint of one process to a peer it connected before (the
  // peer still holds the first one's connection).
  std::vector<double> init, open, connect, close;
  for (int i = 0; i < iters; i++) {
    int fds[2];
    if (pipe(fds) != 0) {
      perror("ep_open: pipe");
      return 2;
    }
    pid_t child = fork();
    if (child == 0) {
      Cycle c = OneCycle(uuid, peer);
      _exit(write(fds[1], &c, sizeof(c)) == sizeof(c) ? 0 : 1);
    }
    ::close(fds[1]);
    Cycle c;
    int status = 0;
    bool ok = read(fds[0], &c, sizeof(c)) == sizeof(c);
    ::close(fds[0]);
    if (child < 0 || waitpid(child, &status, 0) != child || !ok ||
        status != 0) {
      fprintf(stderr, "ep_open: cycle %d failed\n", i);
      return 2;
    }
    init.push_back(c.init);
    open.push_back(c.open);
    connect.push_back(c.connect);
    close.push_back(c.close);
  }
  PrintStats("init", init);
  PrintStats("open", open);
  PrintStats("connect", connect);
  PrintStats("close", close);
  fflush(stdout);

  // Rank 1 waits for one message: send it from one more endpoint.
  psm2_ep_t ep;
  psm2_epid_t epid;
  psm2_mq_t mq = psmd::testing::InitOpenWithMq(uuid, &ep, &epid);
  psm2_mq_tag_t tag{};
  char done = 1;
  CheckPsm(psm2_mq_send2(mq, Connect(ep, peer), 0, &tag, &done, 1),
           "psm2_mq_send2");
  psm2_mq_finalize(mq);
  psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, kTimeoutNs);
  psm2_finalize();
  return 0;
}

int Idle(const psm2_uuid_t uuid, int seconds) {
  psm2_ep_t ep;
  psm2_epid_t epid;
  psmd::testing::InitAndOpen(uuid, &ep, &epid);
  Connect(ep, epid);
  printf("idle: endpoint open, sleeping %d s\n", seconds);
  fflush(stdout);
  sleep(seconds);
  psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, kTimeoutNs);
  psm2_finalize();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool idle = argc > 1 && std::string(argv[1]) == "idle";
  int rank = -1, iters = 100, seconds = 10;
  std::string dir, uuid_text = "5053d0d0000000000000000000000b04";
  for (int i = idle ? 2 : 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--rank") {
      rank = atoi(value.c_str());
    } else if (flag == "--dir") {
      dir = value;
    } else if (flag == "--iters") {
      iters = atoi(value.c_str());
    } else if (flag == "--seconds") {
      seconds = atoi(value.c_str());
    } else if (flag == "--uuid") {
      uuid_text = value;
    } else {
      rank = -2;  // usage
    }
  }
  psm2_uuid_t uuid;
  bool uuid_ok = psmd::testing::ParseUuid(uuid_text, uuid);
  if (idle && uuid_ok && rank == -1) return Idle(uuid, seconds);
  if (!idle && uuid_ok && (rank == 0 || rank == 1) && !dir.empty() &&
      iters >= 1) {
    return rank == 0 ? Rank0(uuid, dir, iters) : Rank1(uuid, dir);
  }
  fprintf(stderr,
          "usage: ep_open --rank 0|1 --dir DIR [--iters N>=1] [--uuid HEX]\n"
          "       ep_open idle [--seconds S] [--uuid HEX]\n");
  return 2;
}
