// MPI semantics over whatever PSM2 library Open MPI's mtl/psm2 loads (psmd's
// libpsm2.so.2 in tests/mpi/run_mpi.sh): ordering with wildcards, probes,
// matched probes, synchronous sends, cancel, large messages with checksums,
// and an all-to-all of random sizes. Run with 2 to 4 ranks; prints one line
// per check on rank 0 and exits non-zero if any check failed on any rank.
#include <mpi.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

int g_rank = 0, g_size = 0, g_failures = 0;

void Check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "rank %d: FAILED: %s\n", g_rank, what);
    g_failures++;
  }
}

uint8_t Pattern(uint64_t seed, uint64_t i) {
  return static_cast<uint8_t>(seed * 977 + i * 13 + (i >> 9));
}

void Fill(std::vector<uint8_t>& b, uint64_t seed) {
  for (size_t i = 0; i < b.size(); i++) b[i] = Pattern(seed, i);
}

bool Intact(const std::vector<uint8_t>& b, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) {
    if (b[i] != Pattern(seed, i)) return false;
  }
  return true;
}

// Every other rank sends kCount messages to rank 0 with increasing tags;
// rank 0 receives them all with MPI_ANY_SOURCE / MPI_ANY_TAG and checks that
// each source's messages arrive in order (MPI non-overtaking).
void AnySourceAnyTagOrder() {
  constexpr int kCount = 2000;
  if (g_rank != 0) {
    for (int i = 0; i < kCount; i++) {
      int payload[2] = {g_rank, i};
      MPI_Send(payload, 2, MPI_INT, 0, i % 97, MPI_COMM_WORLD);
    }
    return;
  }
  std::vector<int> next(g_size, 0);
  bool ok = true;
  for (int n = 0; n < kCount * (g_size - 1); n++) {
    int payload[2];
    MPI_Status st;
    MPI_Recv(payload, 2, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD,
             &st);
    int src = st.MPI_SOURCE;
    ok &= payload[0] == src && payload[1] == next[src] &&
          st.MPI_TAG == next[src] % 97;
    next[src]++;
  }
  Check(ok, "MPI_ANY_SOURCE/MPI_ANY_TAG: per-source order and tags");
}

// Rank 1 sends messages of sizes unknown to rank 0, which sizes its buffer
// with MPI_Iprobe + MPI_Get_count, and with MPI_Mprobe + MPI_Mrecv.
void Probes() {
  const int sizes[] = {0, 1, 777, 65536, 1 << 20};
  if (g_rank == 1) {
    for (int k = 0; k < 2; k++) {
      for (int s : sizes) {
        std::vector<uint8_t> b(s);
        Fill(b, s + k);
        MPI_Send(b.data(), s, MPI_BYTE, 0, 50 + k, MPI_COMM_WORLD);
      }
    }
  } else if (g_rank == 0) {
    bool ok = true;
    for (int s : sizes) {
      int flag = 0;
      MPI_Status st;
      while (!flag) MPI_Iprobe(1, 50, MPI_COMM_WORLD, &flag, &st);
      int count = -1;
      MPI_Get_count(&st, MPI_BYTE, &count);
      ok &= count == s;
      std::vector<uint8_t> b(count > 0 ? count : 1);
      MPI_Recv(b.data(), count, MPI_BYTE, 1, 50, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
      ok &= Intact(b, s, s);
    }
    Check(ok, "MPI_Iprobe + MPI_Get_count + MPI_Recv");
    ok = true;
    for (int s : sizes) {
      MPI_Message msg;
      MPI_Status st;
      MPI_Mprobe(1, 51, MPI_COMM_WORLD, &msg, &st);
      int count = -1;
      MPI_Get_count(&st, MPI_BYTE, &count);
      ok &= count == s;
      std::vector<uint8_t> b(count > 0 ? count : 1);
      MPI_Mrecv(b.data(), count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
      ok &= Intact(b, s, s + 1);
    }
    Check(ok, "MPI_Mprobe + MPI_Mrecv");
  }
}

// MPI_Issend does not complete before the receiver posts its receive.
void SynchronousSend() {
  int value = 42;
  if (g_rank == 1) {
    MPI_Request req;
    MPI_Issend(&value, 1, MPI_INT, 0, 60, MPI_COMM_WORLD, &req);
    int done = 0;
    for (int i = 0; i < 200; i++) {  // ~100 ms of testing while rank 0 sleeps
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) break;
      usleep(500);
    }
    Check(!done, "MPI_Issend completed before the receive was posted");
    MPI_Barrier(MPI_COMM_WORLD);
    if (!done) MPI_Wait(&req, MPI_STATUS_IGNORE);
  } else {
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) {
      int got = 0;
      MPI_Recv(&got, 1, MPI_INT, 1, 60, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      Check(got == 42, "MPI_Ssend payload");
    }
  }
}

// A receive nobody sends to can be cancelled.
void CancelReceive() {
  int buf = 0;
  MPI_Request req;
  MPI_Irecv(&buf, 1, MPI_INT, MPI_ANY_SOURCE, 12345, MPI_COMM_WORLD, &req);
  MPI_Cancel(&req);
  MPI_Status st;
  MPI_Wait(&req, &st);
  int cancelled = 0;
  MPI_Test_cancelled(&st, &cancelled);
  Check(cancelled == 1, "MPI_Cancel of a posted receive");
}

// Messages from 1 B to 64 MiB between neighbours, expected (receive posted
// first) and unexpected (sent first), with checksums.
void LargeMessages() {
  const int peer = g_rank ^ 1;
  if (peer >= g_size) return;
  bool ok = true;
  for (int64_t s = 1; s <= (64 << 20); s *= 8) {
    for (int unexpected = 0; unexpected < 2; unexpected++) {
      std::vector<uint8_t> out(s), in(s);
      Fill(out, s + g_rank);
      MPI_Request r;
      if (!unexpected)
        MPI_Irecv(in.data(), s, MPI_BYTE, peer, 70, MPI_COMM_WORLD, &r);
      if (unexpected && g_rank % 2 == 0) {
        MPI_Send(out.data(), s, MPI_BYTE, peer, 70, MPI_COMM_WORLD);
        MPI_Recv(in.data(), s, MPI_BYTE, peer, 70, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
      } else if (unexpected) {
        MPI_Recv(in.data(), s, MPI_BYTE, peer, 70, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
        MPI_Send(out.data(), s, MPI_BYTE, peer, 70, MPI_COMM_WORLD);
      } else {
        MPI_Send(out.data(), s, MPI_BYTE, peer, 70, MPI_COMM_WORLD);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
      }
      ok &= Intact(in, s, s + peer);
    }
  }
  Check(ok, "messages of 1 B to 64 MiB, intact");
}

// MPI_Alltoallv with random sizes (same seed everywhere, so every rank knows
// every count).
void AllToAllRandom() {
  std::mt19937 rng(1234);
  std::vector<int> counts(g_size * g_size);
  for (int& c : counts) c = static_cast<int>(rng() % 200000);
  std::vector<int> sc(g_size), sd(g_size), rc(g_size), rd(g_size);
  int stotal = 0, rtotal = 0;
  for (int j = 0; j < g_size; j++) {
    sc[j] = counts[g_rank * g_size + j];
    sd[j] = stotal;
    stotal += sc[j];
    rc[j] = counts[j * g_size + g_rank];
    rd[j] = rtotal;
    rtotal += rc[j];
  }
  std::vector<uint8_t> out(stotal + 1), in(rtotal + 1);
  for (int j = 0; j < g_size; j++) {
    for (int i = 0; i < sc[j]; i++)
      out[sd[j] + i] = Pattern(g_rank * 31 + j, i);
  }
  MPI_Alltoallv(out.data(), sc.data(), sd.data(), MPI_BYTE, in.data(),
                rc.data(), rd.data(), MPI_BYTE, MPI_COMM_WORLD);
  bool ok = true;
  for (int j = 0; j < g_size; j++) {
    for (int i = 0; i < rc[j]; i++)
      ok &= in[rd[j] + i] == Pattern(j * 31 + g_rank, i);
  }
  Check(ok, "MPI_Alltoallv of random sizes, intact");
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (g_size < 2) {
    fprintf(stderr, "mpi_semantics needs at least 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  struct {
    const char* name;
    void (*fn)();
  } checks[] = {
      {"any_source_any_tag_order", AnySourceAnyTagOrder},
      {"probes", Probes},
      {"synchronous_send", SynchronousSend},
      {"cancel_receive", CancelReceive},
      {"large_messages", LargeMessages},
      {"all_to_all_random", AllToAllRandom},
  };
  for (const auto& c : checks) {
    int before = g_failures;
    c.fn();
    MPI_Barrier(MPI_COMM_WORLD);
    int failed = g_failures - before, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) printf("%s %s\n", any == 0 ? "PASS" : "FAIL", c.name);
  }
  int total = 0;
  MPI_Allreduce(&g_failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
