// hold_endpoint: holds one endpoint open until SIGTERM, for tests that need
// an endpoint in place (tests/fabric_test.cc puts one on engine shard 0 of
// each daemon, so that a test's own endpoints land on shard 1).
//
//   hold_endpoint --uuid UUID
//
// Prints "held" once the endpoint is open; exits 0 after SIGTERM, having
// closed it.
#include <psm2.h>
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "tests/programs/rendezvous.h"

int main(int argc, char** argv) {
  using psmd::testing::CheckPsm;
  if (argc != 3 || std::strcmp(argv[1], "--uuid") != 0) {
    fprintf(stderr, "usage: hold_endpoint --uuid UUID\n");
    return 2;
  }
  psm2_uuid_t uuid;
  if (!psmd::testing::ParseUuid(argv[2], uuid)) {
    fprintf(stderr, "hold_endpoint: bad uuid %s\n", argv[2]);
    return 2;
  }
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigprocmask(SIG_BLOCK, &term, nullptr);
  psm2_ep_t ep;
  psm2_epid_t epid;
  psmd::testing::InitAndOpen(uuid, &ep, &epid);
  printf("held\n");
  fflush(stdout);
  int sig = 0;
  sigwait(&term, &sig);
  CheckPsm(psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, 0), "psm2_ep_close");
  psm2_finalize();
  return 0;
}
