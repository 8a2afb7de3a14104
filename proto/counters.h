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
  X(rndv_msgs_copied, copied_rendezvous_messages, kCount,                      \
    "Rendezvous messages psmd copied in place from the sender's memory "       \
    "(part of rndv_msgs_sent).")                                               \
  X(rndv_bytes_copied, copied_rendezvous_bytes, kBytes,                        \
    "Payload bytes psmd copied in place (part of rndv_bytes_sent).")           \
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
  X(budget_stalls, budget_stalls, kCount,                                      \
    "Times sends to this endpoint waited 10 s for an unexpected-message "      \
    "budget while it received none of its unexpected messages.")               \
  X(am_requests_sent, sent_am_requests, kCount,                                \
    "Active-message requests sent.")                                           \
  X(am_replies_sent, sent_am_replies, kCount, "Active-message replies sent.")  \
  X(bad_descriptors, bad_descriptors, kCount,                                  \
    "Descriptors the daemon refused as malformed.")                            \
  X(recvs_refused, refused_receives, kCount,                                   \
    "Receives refused: the job's or uid's posted-receive limit.")

// Refusals by a limit, counted per uid (GetStats shows a uid its own, root
// every uid's). Same entry format.
#define PSMD_REFUSAL_COUNTERS(X)                                         \
  X(endpoints_refused, refused_endpoints, kCount,                        \
    "Endpoint opens refused by a limit (psmd's, the uid's or the job's " \
    "endpoints).")                                                       \
  X(control_connections_refused, refused_control_connections, kCount,    \
    "Control connections refused (max_control_connections_per_uid).")    \
  X(attaches_refused, refused_attaches, kCount,                          \
    "Attach requests refused (a token unknown, used or not the uid's).")

namespace psmd::counters {

enum class Unit { kCount, kBytes };

struct Info {
  const char* name;
  const char* metric;
  Unit unit;
  const char* help;
};

}  // namespace psmd::counters

// A list's Id enum (the index of each counter in kAll and in Values), its
// kAll table, its Values array and Accumulate, in the current namespace.
#define PSMD_COUNTER_ID(name, metric, unit, help) k_##name,
#define PSMD_COUNTER_INFO(name, metric, unit, help) \
  {#name, #metric, ::psmd::counters::Unit::unit, help},
#define PSMD_DEFINE_COUNTER_SET(LIST)                                        \
  enum Id : size_t { LIST(PSMD_COUNTER_ID) kNumCounters };                   \
  inline constexpr std::array<::psmd::counters::Info, kNumCounters> kAll = { \
      {LIST(PSMD_COUNTER_INFO)}};                                            \
  using Values = std::array<uint64_t, kNumCounters>;                         \
  inline void Accumulate(const Values& b, Values* a) {                       \
    for (size_t i = 0; i < kNumCounters; i++) (*a)[i] += b[i];               \
  }

namespace psmd::counters {
PSMD_DEFINE_COUNTER_SET(PSMD_ENDPOINT_COUNTERS)
}  // namespace psmd::counters

namespace psmd::refusals {
PSMD_DEFINE_COUNTER_SET(PSMD_REFUSAL_COUNTERS)
}  // namespace psmd::refusals

#endif  // PSMD_PROTO_COUNTERS_H_
