// hostile: what a hostile tenant does with only the public PSM2 API, for
// the adversary suite (tests/adversary_test.cc). Runs one attack until
// --seconds passed or SIGTERM came, then exits 0 (psmd cleans up after it).
// It reports what it achieved, for the test to check against what the
// attack needs and the quota that should stop it (tests/verdicts.h): once
// the attack is in place a line "hostile: ready k=v ...", at its end
// "hostile: done k=v ...". An attack that could not start (opened no
// endpoint, no connection) exits 3 at once instead of idling.
//
//   hostile --attack posted-recvs|connect-junk|endpoints --seconds S
//           [--uuid UUID] [--count N]
//
//   posted-recvs  posts N (default 1,000,000) receives that nothing will
//                 match, half 64-bit (psm2_mq_irecv), half 96-bit exact
//                 (psm2_mq_irecv2), then cancels and reposts them one by
//                 one until the end. Reports posted= (ready), cancels=,
//                 and the slowest cancel and repost in slowest_us=. With
//                 --cancel-all 1 it then cancels every receive, reports
//                 "hostile: cancelled n=", and holds its endpoint until a
//                 second SIGTERM.
//   connect-junk  calls psm2_ep_connect with N (default 400,000) made-up
//                 epids, again and again. Reports epids= and how many of
//                 them the last call found unreachable= (ready after the
//                 first call), calls=.
//   endpoints     opens endpoints (psm2_ep_open, PSM2_MULTI_EP, each in a
//                 job of its own) until refused, and holds them. Reports
//                 opened= (main's included) and refused_with= (the error).
//   control-connections
//                 opens N (default 400) raw connections to $PSMD_SOCKET:
//                 every third sends 3 bytes of the HTTP/2 preface and
//                 stops, the others the preface and a SETTINGS frame (so
//                 psmd hands them to gRPC), and holds them. Reports
//                 connected=, and at the end open= (not closed by psmd).
#include <psm2.h>
#include <psm2_mq.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/programs/rendezvous.h"

namespace {

using Clock = std::chrono::steady_clock;
using psmd::testing::CheckPsm;

constexpr int kExitCouldNotAttack = 3;

volatile sig_atomic_t g_stop = 0;  // SIGTERMs received

void OnTerm(int) { g_stop = g_stop + 1; }

bool Going(Clock::time_point end) { return !g_stop && Clock::now() < end; }

// Holds what the attack took until its end.
void Hold(Clock::time_point end) {
  while (Going(end)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

int PostedRecvs(psm2_ep_t ep, psm2_epid_t epid, uint64_t count, bool cancel_all,
                Clock::time_point end) {
  psm2_mq_t mq;
  CheckPsm(psm2_mq_init(ep, PSM2_MQ_ORDERMASK_ALL, nullptr, 0, &mq), "mq_init");
  psm2_epaddr_t self;
  psm2_error_t conn_err;
  CheckPsm(psm2_ep_connect(ep, 1, &epid, nullptr, &conn_err, &self, 0),
           "connect to self");
  std::vector<psm2_mq_req_t> reqs(count);
  static char buf[8];
  auto post = [&](uint64_t i) {
    if (i % 2 == 0) {
      CheckPsm(psm2_mq_irecv(mq, 0x7000000000000000ull | i, ~0ull, 0, buf,
                             sizeof(buf), nullptr, &reqs[i]),
               "irecv");
    } else {
      psm2_mq_tag_t tag, sel;
      memset(&sel, 0xff, sizeof(sel));
      tag.tag0 = static_cast<uint32_t>(i);
      tag.tag1 = static_cast<uint32_t>(i >> 32);
      tag.tag2 = 0x7e57;
      CheckPsm(psm2_mq_irecv2(mq, self, &tag, &sel, 0, buf, sizeof(buf),
                              nullptr, &reqs[i]),
               "irecv2");
    }
  };
  uint64_t posted = 0;
  for (; posted < count && Going(end); posted++) post(posted);
  printf("hostile: ready posted=%llu\n",
         static_cast<unsigned long long>(posted));
  fflush(stdout);
  uint64_t cancels = 0;
  Clock::duration slowest{};
  for (uint64_t i = 0; posted == count && Going(end); i = (i + 7919) % count) {
    const auto t0 = Clock::now();
    psm2_mq_cancel(&reqs[i]);
    psm2_mq_req_free(mq, reqs[i]);
    post(i);
    slowest = std::max(slowest, Clock::now() - t0);
    cancels++;
  }
  printf("hostile: done posted=%llu cancels=%llu slowest_us=%lld\n",
         static_cast<unsigned long long>(posted),
         static_cast<unsigned long long>(cancels),
         static_cast<long long>(
             std::chrono::duration_cast<std::chrono::microseconds>(slowest)
                 .count()));
  fflush(stdout);
  if (!cancel_all) return 0;
  uint64_t cancelled = 0;
  for (uint64_t i = 0; i < posted; i++) {
    cancelled += psm2_mq_cancel(&reqs[i]) == PSM2_OK;
    psm2_mq_req_free(mq, reqs[i]);
  }
  printf("hostile: cancelled n=%llu\n",
         static_cast<unsigned long long>(cancelled));
  fflush(stdout);
  while (g_stop < 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return 0;
}

int ConnectJunk(psm2_ep_t ep, uint64_t count, Clock::time_point end) {
  std::vector<psm2_epid_t> epids(count);
  std::vector<psm2_error_t> errors(count);
  std::vector<psm2_epaddr_t> addrs(count);
  for (uint64_t i = 0; i < count; i++) epids[i] = 0x00ff000000000000ull + i;
  int calls = 0;
  uint64_t unreachable = 0;
  do {
    psm2_ep_connect(ep, static_cast<int>(count), epids.data(), nullptr,
                    errors.data(), addrs.data(), 0);
    unreachable = 0;
    for (psm2_error_t e : errors) unreachable += e == PSM2_EPID_UNREACHABLE;
    if (calls++ == 0) {
      printf("hostile: ready epids=%llu unreachable=%llu\n",
             static_cast<unsigned long long>(count),
             static_cast<unsigned long long>(unreachable));
      fflush(stdout);
    }
  } while (Going(end));
  printf("hostile: done epids=%llu unreachable=%llu calls=%d\n",
         static_cast<unsigned long long>(count),
         static_cast<unsigned long long>(unreachable), calls);
  return 0;
}

// Each endpoint in a job of its own, so that only the uid's limit stops
// it, not the job's.
int Endpoints(const psm2_uuid_t uuid, Clock::time_point end) {
  int opened = 1;  // the one main opened
  psm2_error_t refused = PSM2_OK;
  for (uint32_t n = 1; refused == PSM2_OK && Going(end); n++) {
    psm2_uuid_t job;
    memcpy(job, uuid, sizeof(job));
    memcpy(job + 12, &n, sizeof(n));
    psm2_ep_t ep;
    psm2_epid_t epid;
    refused = psm2_ep_open(job, nullptr, &ep, &epid);
    opened += refused == PSM2_OK;
  }
  printf("hostile: ready opened=%d refused_with=%d\n", opened, refused);
  fflush(stdout);
  if (opened <= 1) return kExitCouldNotAttack;
  Hold(end);
  printf("hostile: done opened=%d\n", opened);
  return 0;
}

int ControlConnections(uint64_t count, Clock::time_point end) {
  const char* path = getenv("PSMD_SOCKET");
  if (path == nullptr) return 2;
  static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  static const unsigned char kSettings[9] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
  std::vector<int> held;
  for (uint64_t i = 0; i < count; i++) {
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, path, sizeof(addr.sun_path) - 1);
    if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(s);
      continue;
    }
    // psmd may already have closed it (that is its defence): no SIGPIPE.
    bool sent =
        i % 3 == 0
            ? send(s, kPreface, 3, MSG_NOSIGNAL) == 3
            : send(s, kPreface, sizeof(kPreface) - 1, MSG_NOSIGNAL) > 0 &&
                  send(s, kSettings, sizeof(kSettings), MSG_NOSIGNAL) > 0;
    (void)sent;
    held.push_back(s);
  }
  printf("hostile: ready connected=%zu\n", held.size());
  fflush(stdout);
  if (held.empty()) return kExitCouldNotAttack;
  Hold(end);
  // Those psmd refused or dropped read as closed (or reset: it closed them
  // with our bytes unread); the rest it holds.
  size_t open = 0;
  for (int s : held) {
    char byte;
    ssize_t n = recv(s, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    open += n > 0 || (n < 0 && errno == EAGAIN);
  }
  printf("hostile: done connected=%zu open=%zu\n", held.size(), open);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string attack, uuid_text = "0bad0bad0bad0bad0bad0bad0bad0bad";
  double seconds = 3;
  uint64_t count = 0;
  bool cancel_all = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--attack") attack = argv[i + 1];
    if (flag == "--seconds") seconds = atof(argv[i + 1]);
    if (flag == "--uuid") uuid_text = argv[i + 1];
    if (flag == "--count") count = strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--cancel-all") cancel_all = atoi(argv[i + 1]) != 0;
  }
  psm2_uuid_t uuid;
  if (!psmd::testing::ParseUuid(uuid_text, uuid)) return 2;
  signal(SIGTERM, OnTerm);          // ends the attack with its report
  setenv("PSM2_MULTI_EP", "1", 1);  // before psm2_init reads it
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(seconds));
  psm2_ep_t ep;
  psm2_epid_t epid;
  psmd::testing::InitAndOpen(uuid, &ep, &epid);
  setenv("PSM2_NO_VERBOSE_ERRORS", "1", 1);  // failures are the point
  if (attack == "posted-recvs")
    return PostedRecvs(ep, epid, count ? count : 1000000, cancel_all, end);
  if (attack == "connect-junk")
    return ConnectJunk(ep, count ? count : 400000, end);
  if (attack == "endpoints") return Endpoints(uuid, end);
  if (attack == "control-connections")
    return ControlConnections(count ? count : 400, end);
  fprintf(stderr, "hostile: unknown --attack %s\n", attack.c_str());
  return 2;
}
