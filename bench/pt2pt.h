// The two measurements of bench/pingpong and bench/msg_rate, written once
// over a transport, so that the fabric benchmark (scripts/bench_fabric.sh)
// measures a plain TCP socket and MPI exactly as it measures PSM2: the same
// iteration counts, warm-up, timing and medians, the same output lines.
//
// A Transport has, between rank 0 and rank 1:
//   void Send(const char* p, size_t n);   blocking: p reusable on return
//   void Recv(char* p, size_t n);         blocking: n bytes arrived in p
//   void Isend(int slot, const char* p, size_t n); void WaitSend(int slot);
//   void Irecv(int slot, char* p, size_t n);       void WaitRecv(int slot);
//   void PostAck(); void WaitAck(); void SendAck();  a 1-byte message on its
//                                          own tag, rank 1 to rank 0
#ifndef PSMD_BENCH_PT2PT_H_
#define PSMD_BENCH_PT2PT_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace psmd::bench {

constexpr int kWindow = 64;

// Rank 0 sends each size (min_size, 8 B by default, doubling up to max_size;
// from 0 B: 0, 1, 2, 4, ...) and waits for the echo, rank 1 echoes; after a
// warm-up every round trip is timed on its own, and rank 0 prints the median
// half round trip and size / that time. Sizes from 1 MiB run iters / 20 round
// trips (at least 20).
template <typename Transport>
void PingPong(Transport& t, int rank, uint32_t min_size, uint32_t max_size,
              int iters, bool tail) {
  std::vector<char> buf(max_size, 'p');
  if (rank == 0)
    printf("%10s %12s %12s %8s\n", "bytes", "half_rtt_us", "MB/s", "iters");
  for (uint32_t size = min_size; size <= max_size; size = size ? size * 2 : 1) {
    int n = size >= (1u << 20) ? std::max(iters / 20, 20) : iters;
    int warmup = std::max(n / 10, 5);
    std::vector<double> half_rtt_us;
    half_rtt_us.reserve(n);
    for (int i = 0; i < warmup + n; i++) {
      auto t0 = std::chrono::steady_clock::now();
      if (rank == 0) {
        t.Send(buf.data(), size);
        t.Recv(buf.data(), size);
      } else {
        t.Recv(buf.data(), size);
        t.Send(buf.data(), size);
      }
      auto t1 = std::chrono::steady_clock::now();
      if (i >= warmup) {
        half_rtt_us.push_back(
            std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);
      }
    }
    if (rank == 0) {
      std::nth_element(half_rtt_us.begin(), half_rtt_us.begin() + n / 2,
                       half_rtt_us.end());
      double median = half_rtt_us[n / 2];
      printf("%10u %12.2f %12.1f %8d\n", size, median, size / median, n);
      if (tail) {
        std::sort(half_rtt_us.begin(), half_rtt_us.end());
        double sum = 0;
        for (double us : half_rtt_us) sum += us;
        printf(
            "# %u B half round trip: p99 %.2f us, max %.2f us, mean %.2f us\n",
            size, half_rtt_us[n * 99 / 100], half_rtt_us.back(), sum / n);
      }
      fflush(stdout);
    }
  }
}

// Rank 0 keeps kWindow sends of `size` bytes outstanding (each time the
// oldest completes it starts the next), rank 1 keeps kWindow receives
// posted and acknowledges the last message of a repetition. Rank 0 times
// each repetition from its first send to the acknowledgement; returns the
// rates (messages/s) on rank 0, nothing on rank 1.
template <typename Transport>
std::vector<double> Stream(Transport& t, int rank, uint32_t size, long messages,
                           int reps) {
  std::vector<char> bufs(size_t{kWindow} * std::max<uint32_t>(size, 1), 'm');
  auto at = [&](long i) { return &bufs[(i % kWindow) * size]; };
  std::vector<double> rates;
  for (int rep = 0; rep < reps; rep++) {
    if (rank == 0) {
      t.PostAck();
      auto start = std::chrono::steady_clock::now();
      for (long i = 0; i < messages; i++) {
        if (i >= kWindow) t.WaitSend(i % kWindow);
        t.Isend(i % kWindow, at(i), size);
      }
      for (long i = std::max(0L, messages - kWindow); i < messages; i++)
        t.WaitSend(i % kWindow);
      t.WaitAck();
      double s = std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - start)
                     .count();
      rates.push_back(messages / s);
    } else {
      for (long i = 0; i < std::min<long>(kWindow, messages); i++)
        t.Irecv(i % kWindow, at(i), size);
      for (long i = 0; i < messages; i++) {
        t.WaitRecv(i % kWindow);
        if (i + kWindow < messages) t.Irecv(i % kWindow, at(i), size);
      }
      t.SendAck();
    }
  }
  return rates;
}

// The report of one Stream of `size`-byte messages on rank 0: every rate
// and the median, 4 digits (a 4 MiB stream runs a few hundred a second).
inline void PrintRates(std::vector<double> rates, uint32_t size) {
  printf("rates (Mmsg/s):");
  for (double r : rates) printf(" %.4g", r / 1e6);
  std::sort(rates.begin(), rates.end());
  double median = rates[rates.size() / 2];
  printf("\nmedian %.4g Mmsg/s, %.1f MB/s\n", median / 1e6,
         median * size / 1e6);
  fflush(stdout);
}

// Asynchronous progress: how much of one `size`-byte message moves while
// both ranks compute without calling the library. Rank 0 receives: it
// posts the receive, sends rank 1 a go carrying the compute time, computes
// (a busy loop on the clock) and then waits; rank 1 posts the send on the
// go, computes as long and waits. First `reps` rounds without compute give
// the transfer time alone (median T); then `reps` rounds compute 2T each,
// or 200 ms if longer (psmd takes a stalled transfer over only after its
// copy_after_us, 10 ms, and a real computation lasts longer than a copy).
// A message completes all at once, so what moved during the compute is
// read from what the wait after it still takes: done = 1 - wait / T,
// clipped to [0, 1] (1: the transfer finished while the ranks computed;
// 0: it did not start until the library was called). Rank 0 prints T and
// every round's fraction.
template <typename Transport>
void Overlap(Transport& t, int rank, uint32_t size, int reps) {
  using Clock = std::chrono::steady_clock;
  std::vector<char> buf(size, 'o');
  // One round; rank 0 returns the seconds from post to completion and
  // those of the wait after the compute.
  auto round = [&](int64_t compute_ns) -> std::pair<double, double> {
    auto compute = [](Clock::time_point until) {
      while (Clock::now() < until) {
      }
    };
    if (rank == 0) {
      t.Irecv(0, buf.data(), size);
      auto start = Clock::now();
      t.Send(reinterpret_cast<const char*>(&compute_ns), sizeof(compute_ns));
      compute(start + std::chrono::nanoseconds(compute_ns));
      auto waiting = Clock::now();
      t.WaitRecv(0);
      auto end = Clock::now();
      return {std::chrono::duration<double>(end - start).count(),
              std::chrono::duration<double>(end - waiting).count()};
    }
    t.Recv(reinterpret_cast<char*>(&compute_ns), sizeof(compute_ns));
    auto start = Clock::now();
    t.Isend(0, buf.data(), size);
    compute(start + std::chrono::nanoseconds(compute_ns));
    t.WaitSend(0);
    return {0, 0};
  };
  round(0);  // warm-up: first touch of the buffers, connection set-up
  std::vector<double> alone;
  for (int i = 0; i < reps; i++) alone.push_back(round(0).first);
  std::sort(alone.begin(), alone.end());
  double transfer = alone[alone.size() / 2];
  const double compute_s = std::max(2 * transfer, 0.2);
  std::vector<double> done;
  for (int i = 0; i < reps; i++) {
    double wait = round(static_cast<int64_t>(compute_s * 1e9)).second;
    done.push_back(std::clamp(1 - wait / transfer, 0.0, 1.0));
  }
  if (rank == 0) {
    printf("# overlap: %u B, alone %.3f ms, compute %.3f ms\noverlap done:",
           size, transfer * 1e3, compute_s * 1e3);
    for (double d : done) printf(" %.3f", d);
    std::sort(done.begin(), done.end());
    printf("\noverlap median %.3f\n", done[done.size() / 2]);
    fflush(stdout);
  }
}

// The flags of the programs built on this header, pingpong's and
// msg_rate's names where they have one:
//   --min-size B --max-size B --iters N [--tail 1]
//                                        the ping-pong (no ping-pong:
//                                        --max-size 0)
//   --stream SIZE:MESSAGES,...  --reps R  one Stream per pair
//   --overlap SIZE                       Overlap, R rounds of each kind
// and, left for the program, any other "--flag value" in `extra`.
struct Options {
  uint32_t min_size = 8;
  uint32_t max_size = 1u << 22;
  int iters = 1000;
  bool tail = false;
  std::vector<std::pair<uint32_t, long>> streams;
  int reps = 9;
  uint32_t overlap = 0;
  std::vector<std::pair<std::string, std::string>> extra;
};

inline Options ParseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--min-size") {
      o.min_size = static_cast<uint32_t>(strtoul(value.c_str(), nullptr, 10));
    } else if (flag == "--max-size") {
      o.max_size = static_cast<uint32_t>(strtoul(value.c_str(), nullptr, 10));
    } else if (flag == "--iters") {
      o.iters = atoi(value.c_str());
    } else if (flag == "--tail") {
      o.tail = atoi(value.c_str()) != 0;
    } else if (flag == "--overlap") {
      o.overlap = static_cast<uint32_t>(strtoul(value.c_str(), nullptr, 10));
    } else if (flag == "--reps") {
      o.reps = atoi(value.c_str());
    } else if (flag == "--stream") {
      for (const char* p = value.c_str(); *p;) {
        char* end;
        uint32_t size = static_cast<uint32_t>(strtoul(p, &end, 10));
        long messages = *end == ':' ? strtol(end + 1, &end, 10) : 0;
        if (messages < kWindow || (*end != ',' && *end != 0)) {
          fprintf(stderr, "--stream wants SIZE:MESSAGES>=%d,... (got %s)\n",
                  kWindow, value.c_str());
          exit(2);
        }
        o.streams.emplace_back(size, messages);
        p = *end ? end + 1 : end;
      }
    } else {
      o.extra.emplace_back(flag, value);
    }
  }
  if (o.iters < 1 || o.reps < 1) {
    fprintf(stderr, "--iters and --reps must be at least 1\n");
    exit(2);
  }
  return o;
}

// The ping-pong, then every stream, then the overlap, reported on rank 0
// (the first two as bench/pingpong and bench/msg_rate report them).
template <typename Transport>
void Run(Transport& t, int rank, const Options& o) {
  if (o.max_size > 0 && o.max_size >= o.min_size)
    PingPong(t, rank, o.min_size, o.max_size, o.iters, o.tail);
  for (auto [size, messages] : o.streams) {
    std::vector<double> rates = Stream(t, rank, size, messages, o.reps);
    if (rank == 0) {
      printf("# stream: %u B messages, window %d, %ld messages x %d reps\n",
             size, kWindow, messages, o.reps);
      PrintRates(rates, size);
    }
  }
  if (o.overlap > 0) Overlap(t, rank, o.overlap, o.reps);
}

}  // namespace psmd::bench

#endif  // PSMD_BENCH_PT2PT_H_
