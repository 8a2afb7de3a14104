// The one list of psmd's per-endpoint counters. Everything that handles
// counters follows from PSMD_ENDPOINT_COUNTERS: the daemon's counter struct
// (daemon/engine/endpoint.h), its snapshots and totals
// (daemon/control/registry.h), the GetStats reply (a name -> value map in
// proto/control.proto), and psmctl's table, JSON and Prometheus output
// (tools/psmctl.cc). Adding a counter is one line here plus the increment where
// the event happens.
//
// Each entry: X(name, unit, help)
//   name    the field, JSON key, table column and Prometheus name
//           ("msgs_sent": psmd_msgs_sent_total for the node,
//           psmd_job_msgs_sent_total per job); one word for a counter
//           everywhere, never renamed: scripts and dashboards read it
//   unit    how psmctl writes a number: kCount (1.2 M) or kBytes (3.4 GiB)
//   help    one line for --help, HELP lines and the man page
//
// Thread-safety: constant data only.
#ifndef PSMD_PROTO_COUNTERS_H_
#define PSMD_PROTO_COUNTERS_H_

#include <array>
#include <cstddef>
#include <cstdint>

#define PSMD_ENDPOINT_COUNTERS(X)                                            \
  X(msgs_sent, kCount, "Messages sent (eager and rendezvous).")              \
  X(bytes_sent, kBytes, "Payload bytes sent.")                               \
  X(rndv_msgs_sent, kCount,                                                  \
    "Messages sent by rendezvous (part of msgs_sent).")                      \
  X(rndv_bytes_sent, kBytes,                                                 \
    "Payload bytes sent by rendezvous (part of bytes_sent).")                \
  X(rndv_msgs_copied, kCount,                                                \
    "Rendezvous messages psmd copied in place from the sender's memory "     \
    "(part of rndv_msgs_sent).")                                             \
  X(rndv_bytes_copied, kBytes,                                               \
    "Payload bytes psmd copied in place (part of rndv_bytes_sent).")         \
  X(msgs_received, kCount, "Messages received.")                             \
  X(bytes_received, kBytes, "Payload bytes received.")                       \
  X(unexpected_msgs, kCount,                                                 \
    "Messages that arrived before their receive was posted.")                \
  X(unexpected_bytes, kBytes,                                                \
    "Payload bytes of messages that arrived before their receive.")          \
  X(posted_recvs, kCount, "Receives posted.")                                \
  X(probes, kCount, "Probes (psm2_mq_iprobe and kin) answered.")             \
  X(sends_held, kCount,                                                      \
    "Times a send waited for its receiver's unexpected-message budget.")     \
  X(budget_stalls, kCount,                                                   \
    "Times sends to this endpoint waited 10 s for an unexpected-message "    \
    "budget while it received none of its unexpected messages.")             \
  X(am_requests_sent, kCount, "Active-message requests sent.")               \
  X(am_replies_sent, kCount, "Active-message replies sent.")                 \
  X(bad_descriptors, kCount, "Descriptors the daemon refused as malformed.") \
  X(recvs_refused, kCount,                                                   \
    "Receives refused: the job's or uid's posted-receive limit.")

// Refusals by a limit, counted per uid (GetStats shows a uid its own, root
// every uid's). Same entry format.
#define PSMD_REFUSAL_COUNTERS(X)                                         \
  X(endpoints_refused, kCount,                                           \
    "Endpoint opens refused by a limit (psmd's, the uid's or the job's " \
    "endpoints).")                                                       \
  X(control_connections_refused, kCount,                                 \
    "Control connections refused (max_control_connections_per_uid).")    \
  X(attaches_refused, kCount,                                            \
    "Attach requests refused (a token unknown, used or not the uid's).")

// The counters per peer node of the fabric between nodes' daemons, as
// psmctl shows them, in this order. Everything that handles them follows
// from these lists: hw::PeerStats (hw/fabric.h: the fabric's), the
// engine's per node (Remote::PeerCounts, daemon/remote/remote.h), the GetStats
// reply's PeerNodeStats (proto/control.proto: a field per entry, same name,
// checked by //proto:counters_test) and psmctl's table, JSON and
// Prometheus output.
//
// Each entry: X(name, column, unit, help)
//   name    the field (in hw::PeerStats or Remote::PeerCounts and in
//           PeerNodeStats), the JSON key and the Prometheus name
//           (psmd_fabric_<name>_total); never renamed
//   column  psmctl's table heading
//   unit    kCount or kBytes
//   help    one line for HELP lines
//
// Traffic, which the table writes human-readable in wide columns:
#define PSMD_FABRIC_TRAFFIC_COUNTERS(X)                                   \
  X(frames_sent, frames_sent, kCount, "Data frames sent to a peer node.") \
  X(bytes_sent, bytes_sent, kBytes, "Payload bytes sent to a peer node.") \
  X(frames_received, frames_recv, kCount,                                 \
    "Data frames received from a peer node.")                             \
  X(bytes_received, bytes_recv, kBytes,                                   \
    "Payload bytes received from a peer node.")
// Events, each worth seeing, which the table writes exactly: the fabric's
#define PSMD_FABRIC_EVENT_COUNTERS(X)                                   \
  X(connects, connects, kCount, "Connections opened with a peer node.") \
  X(disconnects, disconn, kCount,                                       \
    "Connections with a peer node that ended other than by close.")     \
  X(connect_failures, conn_err, kCount,                                 \
    "Connects to a peer node that failed.")                             \
  X(auth_failures, auth_err, kCount,                                    \
    "Handshakes refused for authentication (node 0: unauthenticated).") \
  X(bad_frames, bad_frm, kCount, "Connections dropped for an invalid frame.")
// the fabric's sessions (docs/design.md, "Sessions: a broken connection
// resumes"), listed last for the proto's field numbers,
#define PSMD_FABRIC_SESSION_COUNTERS(X)                           \
  X(resumes, resumes, kCount,                                     \
    "Broken connections with a peer node whose session resumed.") \
  X(frames_replayed, replayed, kCount,                            \
    "Data frames sent again to a peer node when a session resumed.")
// and the engine's (docs/design.md, "Between nodes: the engine").
#define PSMD_REMOTE_EVENT_COUNTERS(X)                                      \
  X(refused, refused, kCount,                                              \
    "Frames refused: no endpoint of that epid, job and uid here.")         \
  X(parked, parked, kCount,                                                \
    "Frames from that node parked here for a slow receiver.")              \
  X(xoffs, xoffs, kCount,                                                  \
    "Times that node asked us to hold messages to one of its endpoints.")  \
  X(kept, kept, kCount,                                                    \
    "Eager payloads from that node kept here for unexpected messages.")    \
  X(eager_offs, eager_off, kCount,                                         \
    "Times that node asked for eager messages to one of its endpoints as " \
    "envelopes only.")                                                     \
  X(malformed, malformed, kCount,                                          \
    "Connections dropped for a frame the engine refused (malformed, or "   \
    "out of turn).")
// and the engine's RMA rendezvous (docs/design.md, "Rendezvous by RMA
// read"), listed after the sessions' for the proto's field numbers.
#define PSMD_REMOTE_RMA_COUNTERS(X)                                  \
  X(rma_reads, rma_rd, kCount,                                       \
    "RMA reads from that node's pool into ours that completed (the " \
    "rendezvous by RMA read).")                                      \
  X(rma_bytes, rma_bytes, kBytes,                                    \
    "Bytes read by RMA from that node's pool into ours.")
// hw::PeerStats, and every counter per peer node.
#define PSMD_FABRIC_PEER_COUNTERS(X) \
  PSMD_FABRIC_TRAFFIC_COUNTERS(X)    \
  PSMD_FABRIC_EVENT_COUNTERS(X) PSMD_FABRIC_SESSION_COUNTERS(X)
#define PSMD_PEER_COUNTERS(X)     \
  PSMD_FABRIC_TRAFFIC_COUNTERS(X) \
  PSMD_FABRIC_EVENT_COUNTERS(X)   \
  PSMD_REMOTE_EVENT_COUNTERS(X)   \
  PSMD_FABRIC_SESSION_COUNTERS(X) PSMD_REMOTE_RMA_COUNTERS(X)

namespace psmd::counters {

enum class Unit { kCount, kBytes };

struct Info {
  const char* name;
  Unit unit;
  const char* help;
};

}  // namespace psmd::counters

// A list's Id enum (the index of each counter in kAll and in Values), its
// kAll table, its Values array and Accumulate, in the current namespace.
#define PSMD_COUNTER_ID(name, unit, help) k_##name,
#define PSMD_COUNTER_INFO(name, unit, help) \
  {#name, ::psmd::counters::Unit::unit, help},
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
