// The one list of psmd's per-endpoint counters. Everything that handles
// counters follows from PSMD_ENDPOINT_COUNTERS: the daemon's counter struct
// (daemon/endpoint.h), its snapshots and totals (daemon/registry.h), the
// GetStats reply (a name -> value map in proto/control.proto), and psmctl's
// table, JSON and Prometheus output (tools/psmctl.cc). Adding a counter is
// one line here plus the increment where the event happens.
//
// Each entry: X(name, metric, unit, help)
//   name    the field, JSON key and table row ("msgs_sent"); never renamed,
//           scripts read it
//   metric  the Prometheus name without the psmd_ prefix and _total suffix,
//           unit last as Prometheus asks ("sent_messages")
//   unit    how psmctl writes a number: kCount (1.2 M) or kBytes (3.4 GiB)
//   help    one line for --help, HELP lines and the man page
//
// Thread-safety: constant data only.
#ifndef PSMD_PROTO_COUNTERS_H_
#define PSMD_PROTO_COUNTERS_H_

#include <array>
#include <cstddef>
#include <cstdint>

#define PSMD_ENDPOINT_COUNTERS(X)                                              \
  X(msgs_sent, sent_messages, kCount, "Messages sent (eager and rendezvous).") \
  X(bytes_sent, sent_bytes, kBytes, "Payload bytes sent.")                     \
  X(rndv_msgs_sent, sent_rendezvous_messages, kCount,                          \
    "Messages sent by rendezvous (part of msgs_sent).")                        \
  X(rndv_bytes_sent, sent_rendezvous_bytes, kBytes,                            \
    "Payload bytes sent by rendezvous (part of bytes_sent).")                  \
  X(msgs_received, received_messages, kCount, "Messages received.")            \
  X(bytes_received, received_bytes, kBytes, "Payload bytes received.")         \
  X(unexpected_msgs, unexpected_messages, kCount,                              \
    "Messages that arrived before their receive was posted.")                  \
  X(unexpected_bytes, unexpected_bytes, kBytes,                                \
    "Payload bytes of messages that arrived before their receive.")            \
  X(posted_recvs, posted_receives, kCount, "Receives posted.")                 \
  X(probes, probes, kCount, "Probes (psm2_mq_iprobe and kin) answered.")       \
  X(sends_held, held_sends, kCount,                                            \
    "Times a send waited for its receiver's unexpected-message budget.")       \
  X(am_requests_sent, sent_am_requests, kCount,                                \
    "Active-message requests sent.")                                           \
  X(am_replies_sent, sent_am_replies, kCount, "Active-message replies sent.")  \
  X(bad_descriptors, bad_descriptors, kCount,                                  \
    "Descriptors the daemon refused as malformed.")

namespace psmd::counters {

enum class Unit { kCount, kBytes };

struct Info {
  const char* name;
  const char* metric;
  Unit unit;
  const char* help;
};

// Index of each counter in kAll and in Values.
enum Id : size_t {
#define PSMD_COUNTER_ID(name, metric, unit, help) k_##name,
  PSMD_ENDPOINT_COUNTERS(PSMD_COUNTER_ID)
#undef PSMD_COUNTER_ID
      kNumCounters
};

inline constexpr std::array<Info, kNumCounters> kAll = {{
#define PSMD_COUNTER_INFO(name, metric, unit, help) \
  {#name, #metric, Unit::unit, help},
    PSMD_ENDPOINT_COUNTERS(PSMD_COUNTER_INFO)
#undef PSMD_COUNTER_INFO
}};

// One value per counter, in list order.
using Values = std::array<uint64_t, kNumCounters>;

inline void Accumulate(const Values& b, Values* a) {
  for (size_t i = 0; i < kNumCounters; i++) (*a)[i] += b[i];
}

}  // namespace psmd::counters

#endif  // PSMD_PROTO_COUNTERS_H_
