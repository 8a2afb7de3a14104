// async_progress: how much of a large message moves while both ranks compute
// without calling PSM2 (issue 16, "asynchronous progress"). A PSM2 program,
// so the same binary runs on psmd's library and on Intel's libpsm2.
//
//   async_progress --rank R --dir DIR --uuid UUID [--bytes N]
//                  [--compute-ms T] [--reps K] [--unmap]
//
// Each repetition: rank 0 fills its buffer and says it is ready (a small
// message); rank 1 posts a receive of N bytes into a zeroed buffer, waits
// for that, and tells rank 0 (another), which posts the send; then both
// compute for T ms, calling nothing (rank 1 from the moment it told). On
// return, before any PSM2 call, rank 1 counts the 4 KiB pages of its buffer
// that already hold the message, then calls psm2_mq_test once. Both then wait
// and rank 1 checks every byte.
//
// Rank 1 prints one line per repetition:
//   arrived <fraction of pages> test <1 if psm2_mq_test completed it> intact 1
// and exits 0 if every message arrived intact.
//
// With --unmap (a sender that lies about its buffer), rank 0 posts the send
// first, unmaps the buffer, and stays away from the library for 300 ms, so
// that psmd takes the transfer over and finds the range unmapped. Each rank
// prints "error <psm2_error_t>" of its request and exits 0 if both failed
// with PSM2_PARAM_ERR, the message unreceivable but nothing else affected:
// an ordinary message then still goes through.
#include <psm2.h>
#include <psm2_mq.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/programs/rendezvous.h"

namespace {

using psmd::testing::CheckPsm;
using psmd::testing::ExactSelector;
using psmd::testing::TagOf;

uint8_t Pattern(size_t i, int rep) {
  return static_cast<uint8_t>((i * 131 + rep * 7 + (i >> 12)) | 1);  // never 0
}

// Keeps a core busy for `ms` without touching PSM2 (the "application").
double Compute(int ms) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  volatile double x = 1.0;
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 1000; i++) x = x * 1.0000001 + 1e-9;
  }
  return x;
}

void Blocking(psm2_mq_t mq, psm2_epaddr_t peer, bool send, uint32_t tag) {
  psm2_mq_tag_t t = TagOf(tag), sel = ExactSelector();
  char byte = 0;
  psm2_mq_req_t req;
  if (send) {
    CheckPsm(psm2_mq_isend2(mq, peer, 0, &t, &byte, 1, nullptr, &req),
             "psm2_mq_isend2");
  } else {
    CheckPsm(psm2_mq_irecv2(mq, peer, &t, &sel, 0, &byte, 1, nullptr, &req),
             "psm2_mq_irecv2");
  }
  CheckPsm(psm2_mq_wait2(&req, nullptr), "psm2_mq_wait2");
}

// --unmap: see the top of the file.
int LyingSender(const psmd::testing::ConnectedPair& p, size_t bytes, int rank) {
  psm2_mq_tag_t t = TagOf(7), sel = ExactSelector();
  psm2_mq_req_t req;
  psm2_mq_status2_t st{};
  if (rank == 0) {
    void* buf = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return 2;
    memset(buf, 1, bytes);
    CheckPsm(psm2_mq_isend2(p.mq, p.peer, 0, &t, buf, bytes, nullptr, &req),
             "psm2_mq_isend2");
    munmap(buf, bytes);
    Blocking(p.mq, p.peer, true, 1);
    // Away from the library while psmd takes the transfer over (after
    // copy_after_us): streaming from the unmapped buffer would crash us.
    usleep(300'000);
    psm2_mq_wait2(&req, &st);
  } else {
    std::vector<uint8_t> buf(bytes);
    Blocking(p.mq, p.peer, false, 1);
    CheckPsm(psm2_mq_irecv2(p.mq, p.peer, &t, &sel, 0, buf.data(), bytes,
                            nullptr, &req),
             "psm2_mq_irecv2");
    psm2_mq_wait2(&req, &st);
  }
  printf("error %d\n", static_cast<int>(st.error_code));
  fflush(stdout);
  // The pair still works.
  Blocking(p.mq, p.peer, rank == 0, 3);
  return st.error_code == PSM2_PARAM_ERR ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int rank = -1;
  std::string dir, uuid_text;
  size_t bytes = 64u << 20;
  int compute_ms = 500, reps = 1;
  bool unmap = false;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--unmap") {
      unmap = true;
      continue;
    }
    if (i + 1 >= argc) break;
    const char* v = argv[++i];
    if (a == "--rank")
      rank = atoi(v);
    else if (a == "--dir")
      dir = v;
    else if (a == "--uuid")
      uuid_text = v;
    else if (a == "--bytes")
      bytes = strtoull(v, nullptr, 0);
    else if (a == "--compute-ms")
      compute_ms = atoi(v);
    else if (a == "--reps")
      reps = atoi(v);
  }
  psm2_uuid_t uuid;
  if ((rank != 0 && rank != 1) || dir.empty() ||
      !psmd::testing::ParseUuid(uuid_text, uuid) || bytes == 0) {
    fprintf(stderr,
            "usage: async_progress --rank 0|1 --dir DIR --uuid UUID "
            "[--bytes N] [--compute-ms T] [--reps K]\n");
    return 2;
  }
  psmd::testing::ConnectedPair p =
      psmd::testing::OpenAndConnect(uuid, dir, rank);
  if (unmap) {
    int code = LyingSender(p, bytes, rank);
    psm2_ep_close(p.ep, PSM2_EP_CLOSE_GRACEFUL, 2'000'000'000LL);
    psm2_finalize();
    return code;
  }
  std::vector<uint8_t> buf(bytes);
  bool all_intact = true;
  for (int rep = 0; rep < reps; rep++) {
    psm2_mq_tag_t t = TagOf(100 + rep), sel = ExactSelector();
    psm2_mq_req_t req;
    if (rank == 1) {
      memset(buf.data(), 0, bytes);
      CheckPsm(psm2_mq_irecv2(p.mq, p.peer, &t, &sel, 0, buf.data(), bytes,
                              nullptr, &req),
               "psm2_mq_irecv2");
      // Rank 0 has its message ready: it posts the send as soon as it is
      // told (filling 64 MiB takes a second in an unoptimized build on a
      // loaded machine, which rank 1 would otherwise spend computing).
      Blocking(p.mq, p.peer, false, 2);
      Blocking(p.mq, p.peer, true, 1);  // "posted": compute from here
      Compute(compute_ms);
      size_t pages = 0, whole = 0;
      for (size_t off = 0; off < bytes; off += 4096, pages++) {
        size_t end = std::min(bytes, off + 4096);
        bool here = true;
        for (size_t i = off; i < end && here; i++)
          here = buf[i] == Pattern(i, rep);
        whole += here;
      }
      // PSM2_MQ_NO_COMPLETIONS: not complete yet.
      const int done = psm2_mq_test2(&req, nullptr) == PSM2_OK;
      if (!done) CheckPsm(psm2_mq_wait2(&req, nullptr), "psm2_mq_wait2");
      bool intact = true;
      for (size_t i = 0; i < bytes && intact; i++) {
        intact = buf[i] == Pattern(i, rep);
      }
      all_intact &= intact;
      printf("arrived %.4f test %d intact %d\n",
             static_cast<double>(whole) / pages, done, intact ? 1 : 0);
      fflush(stdout);
    } else {
      for (size_t i = 0; i < bytes; i++) buf[i] = Pattern(i, rep);
      Blocking(p.mq, p.peer, true, 2);  // "ready"
      Blocking(p.mq, p.peer, false, 1);
      CheckPsm(
          psm2_mq_isend2(p.mq, p.peer, 0, &t, buf.data(), bytes, nullptr, &req),
          "psm2_mq_isend2");
      Compute(compute_ms);
      CheckPsm(psm2_mq_wait2(&req, nullptr), "psm2_mq_wait2");
    }
  }
  psm2_ep_close(p.ep, PSM2_EP_CLOSE_GRACEFUL, 2'000'000'000LL);
  psm2_finalize();
  return all_intact ? 0 : 1;
}
