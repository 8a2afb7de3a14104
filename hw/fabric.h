// The fabric: how one node's daemon exchanges frames with other nodes'
// daemons. A backend (hw/socket/: TCP on io_uring; hw/ofi/: libfabric;
// each one folder) implements `Fabric`. The model follows MPICH's sock
// layer: every operation is *posted* and finishes as an *event* returned by one
// poll/wait call; failures are error classes, not errno values.
//
//   Open        listen on every configured address (a port range per
//               address: the first free port is taken)
//   Connect     reach a node by its host description, which lists all its
//               listen addresses; they are tried in turn
//   PostSend    one frame (header fields + an iovec list); its buffers
//               must stay valid until its kSendDone event
//   PostRecv    a buffer (iovec list) for the next frame on a connection;
//               with none posted nothing is read, so TCP holds the sender
//               back (this is the back-pressure path)
//   PostRecvHeader + PostPayload
//               the next frame's header first (kHeader), then the user
//               says where its payload goes, chosen from the header: how
//               a rendezvous chunk lands in its final place with no copy
//   Close       every pending operation completes with kCanceled, then
//               one kClosed event
//   Poll/Wait   deliver events; Poll never enters the kernel when nothing
//               is there, Wait sleeps up to a timeout
//   RegisterRegion + PostRead
//               RMA, where the backend can (CanRead): memory registered
//               once is named to a peer by a RemoteRegion (sent in a frame
//               of the user's); the peer reads from it straight into a
//               region of its own, no copy in either daemon (kReadDone)
//
// hw/ knows nothing of tags, endpoints or PSM2: the frame fields it carries
// for its user are opaque (see frame.h).
//
// One connection per node pair: Connect to a node that already has one
// returns it (kAlreadyConnected). When two nodes connect to each other at
// the same time, the connection opened by the node with the lower node id
// survives; the other side's Connect handle is bound to it (the user sees
// one kConnected on its handle, never a second connection).
//
// Destroying a Fabric closes everything at once, without events.
//
// Thread-safety: a Fabric is used by one thread (the progress worker); only
// event_fd() may be watched from elsewhere. Backends may run helper
// threads of their own (authentication) without the caller noticing.
#ifndef PSMD_HW_FABRIC_H_
#define PSMD_HW_FABRIC_H_

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hw/frame.h"
#include "proto/counters.h"

namespace psmd::hw {

// Error classes (MPIDU_SOCK_ERR_* in spirit): what the caller can act on.
enum class ErrorClass {
  kOk = 0,
  kBusy,              // back-pressure: too much in flight on this
                      // connection; retry after one of its kSendDone
  kBadConn,           // no such connection (closed, never opened)
  kBadArg,            // malformed request (too many iovecs, too long, ...)
  kBadHost,           // host description not valid
  kAlreadyConnected,  // Connect: the node has a connection; *conn is it
  kConnFailed,        // no address of the node could be reached
  kAuthFailed,        // the peer refused our credential, or sent a bad one
  kPeerClosed,        // the peer closed the connection
  kConnReset,         // the connection broke (reset, I/O error)
  kTimeout,           // connect/handshake or an unacknowledged send timed out
  kBadFrame,          // the peer sent an invalid frame; connection dropped
  kTruncated,         // a frame longer than the posted receive; the rest
                      // was discarded, the connection goes on
  kCanceled,          // the operation was ended by a local Close
  kLimit,             // a configured limit (connections, ...) is reached
  kFail,              // anything else (logged with the cause)
};
const char* ErrorClassName(ErrorClass e);

using ConnId = uint64_t;  // never reused within one Fabric; 0 is none

enum class EventType {
  kConnected,  // Connect finished (error says whether it worked)
  kAccepted,   // a peer connected to us and authenticated; new conn
  kSendDone,   // a posted send finished (error kOk or why not)
  kRecvDone,   // a frame arrived into a posted receive (or PostPayload)
  kHeader,     // a header-only receive got a header; `length` is the
               // payload's size (0: the frame is complete)
  kClosed,     // the connection is gone (error: why); its id is dead
  kReadDone,   // a PostRead finished (error kOk or why not); `length`
               // is the bytes read
};

struct Event {
  EventType type = EventType::kClosed;
  ErrorClass error = ErrorClass::kOk;
  ConnId conn = 0;
  uint64_t cookie = 0;     // what the Connect/PostSend/PostRecv was given
  uint64_t peer_node = 0;  // kConnected, kAccepted
  uint32_t length = 0;     // kRecvDone: payload bytes placed; kReadDone:
                           // bytes read
  FrameFields fields;      // kRecvDone: the frame's header fields
};

// Counters per peer node, for psmctl stats: one per entry of
// PSMD_FABRIC_PEER_COUNTERS (proto/counters.h, which says what each
// counts). Frames are data frames whose send completed (or that arrived),
// bytes their payload bytes; connects counts connections opened by either
// side (more than one means reconnects). Failures of peers that never
// authenticated are counted under node 0 (a claimed node id is not
// trusted, and counting under it would let anyone add rows).
struct PeerStats {
  uint64_t node = 0;
#define PSMD_PEER_STATS_FIELD(name, column, unit, help) uint64_t name = 0;
  PSMD_FABRIC_PEER_COUNTERS(PSMD_PEER_STATS_FIELD)
#undef PSMD_PEER_STATS_FIELD
};

struct FabricOptions {
  uint64_t node_id = 0;  // non-zero, unique among the nodes
  // "ADDR[:PORT[-PORT]]" (IPv6 as "[ADDR]:PORT"); port 0 or none: any.
  std::vector<std::string> listen;
  AuthMode auth = AuthMode::kMunge;
  std::string munge_socket;   // empty: libmunge's default
  uint32_t required_uid = 0;  // the uid peer credentials must carry
  // Connect + handshake, and unacknowledged data on an open connection
  // (TCP_USER_TIMEOUT, keepalive), must finish within this.
  uint32_t timeout_ms = 5000;
  // Sessions (hw/link_fabric.h): acknowledged frames, and a connection
  // that breaks resumes within timeout_ms. Every node must agree: a hello
  // that differs is refused.
  bool sessions = false;
  // RMA reads (CanRead), where the backend and provider have them. Off,
  // no memory is registered for remote access: a provider serves reads of
  // registered memory to whoever reaches its endpoint and names a key and
  // an address, which psmd cannot check (docs/design.md, "Rendezvous by
  // RMA read").
  bool rma = false;
  // TCP_USER_TIMEOUT of open connections: 0 means timeout_ms;
  // kNoUserTimeout leaves the kernel's retransmission limits. Linux also
  // aborts a connection whose peer advertised a zero window for longer
  // than TCP_USER_TIMEOUT, so a user that pauses receiving for longer
  // (back-pressure) turns it off and watches liveness itself (the daemon's
  // heartbeat frames, daemon/remote/remote.h).
  uint32_t user_timeout_ms = 0;
  static constexpr uint32_t kNoUserTimeout = UINT32_MAX;
  uint32_t connect_attempt_ms = 1000;  // per address tried
  FrameLimits limits;
  uint32_t max_iov = 16;  // per PostSend / PostRecv
  // Back-pressure: sends posted and not yet done, per connection.
  uint32_t max_send_frames = 256;
  uint64_t max_send_bytes = 32u << 20;
  uint32_t max_connections = 4096;
  uint32_t max_handshakes = 64;     // incoming, not yet authenticated
  uint32_t credential_ttl_s = 300;  // how long connector nonces are kept
  uint32_t ring_entries = 256;
  // Non-zero: this process carries on a predecessor's sessions under its
  // incarnation (a handover: AdoptSessions); 0: a new incarnation. Peers
  // resume a session only with the incarnation it opened with.
  uint64_t incarnation = 0;
  // The ofi backend: the libfabric provider, in libfabric's syntax
  // ("tcp;ofi_rxm", "udp;ofi_rxd"); empty: the first RDM provider that
  // serves the listen address.
  std::string provider;
};

// What a peer needs to read from a region registered by RegisterRegion: it
// travels in the user's frames, so the reader must treat it as untrusted
// (the backend checks only what it can: a length within the region the
// reader named; the provider checks the key against the registration).
struct RemoteRegion {
  uint64_t addr = 0;    // the region's first byte as the provider names it
                        // (a virtual address under FI_MR_VIRT_ADDR, else 0)
  uint64_t key = 0;     // the registration's key
  uint64_t length = 0;  // bytes registered
};

// A local registration (RegisterRegion); 0 is none.
using RegionId = uint64_t;

struct CarriedSession;  // below

class Fabric {
 public:
  virtual ~Fabric() = default;

  // "NODE@ADDR:PORT,ADDR:PORT..." with the ports actually bound.
  virtual std::string HostDescription() const = 0;
  // The libfabric provider actually opened ("tcp;ofi_rxm"; the first that
  // served when none was asked for); empty for a backend not on libfabric.
  virtual std::string Provider() const { return {}; }
  // Readable whenever an event may be ready (an eventfd: read it to
  // rearm), for the daemon's epoll sleep. Poll after it fires.
  virtual int event_fd() const = 0;

  virtual ErrorClass Connect(const std::string& host_description,
                             uint64_t cookie, ConnId* conn) = 0;
  // Queues a frame; it leaves at the next Poll or Wait, together with the
  // frames posted before that (one sendmsg where the backend can).
  virtual ErrorClass PostSend(ConnId conn, const FrameFields& fields,
                              const iovec* iov, int iovcnt,
                              uint64_t cookie) = 0;
  virtual ErrorClass PostRecv(ConnId conn, const iovec* iov, int iovcnt,
                              uint64_t cookie) = 0;
  // Header-first receiving. The next frame's header ends this receive as a
  // kHeader event; if its payload is not empty, nothing more is read from
  // the connection until PostPayload gives the payload's iovecs (kRecvDone
  // follows, truncated past their capacity as with PostRecv). PostPayload
  // at any other time is kBadArg.
  virtual ErrorClass PostRecvHeader(ConnId conn, uint64_t cookie) = 0;
  virtual ErrorClass PostPayload(ConnId conn, const iovec* iov, int iovcnt,
                                 uint64_t cookie) = 0;
  virtual ErrorClass Close(ConnId conn) = 0;

  // Up to `max` events into `events`; returns how many. Poll never blocks;
  // Wait sleeps up to timeout_ms (-1: no limit) for the first one.
  virtual int Poll(Event* events, int max) = 0;
  virtual int Wait(Event* events, int max, int timeout_ms) = 0;

  // ---- RMA (a backend without it answers false / kBadArg) ----
  // Whether PostRead works: the provider offers reads (FI_RMA|FI_READ).
  virtual bool CanRead() const { return false; }
  // The longest single PostRead (the provider's max_msg_size, capped).
  virtual size_t MaxReadLength() const { return 0; }
  // Registers [base, base + length) for remote reads by peers and as the
  // target of our own reads, until DeregisterRegion returns kOk: the caller
  // keeps the memory valid until then. kLimit past the backend's bound.
  // DeregisterRegion is kBusy while the provider may still write into the
  // region: a read into it is outstanding, or was ended for the user by
  // the deadline or its connection's end (kTimeout, kConnReset) but not
  // yet by the provider (retry later; destroying the fabric ends all).
  virtual ErrorClass RegisterRegion(void* base, size_t length, RegionId* id,
                                    RemoteRegion* remote) {
    (void)base, (void)length, (void)id, (void)remote;
    return ErrorClass::kBadArg;
  }
  virtual ErrorClass DeregisterRegion(RegionId id) {
    (void)id;
    return ErrorClass::kBadArg;
  }
  // Whether the provider may still write into region `id`: what makes
  // DeregisterRegion kBusy. A read ended for the user by its deadline or
  // its connection may still land, so its target stays the provider's
  // until this says false.
  virtual bool RegionBusy(RegionId id) const {
    (void)id;
    return false;
  }
  // Reads `length` bytes at `remote_offset` in the peer's region `remote`
  // (announced by the peer at the other end of `conn`) into our region
  // `local` at `local_offset`; one kReadDone follows. kBadArg when a range
  // falls outside its region or length exceeds MaxReadLength; kBusy when
  // too many reads are outstanding (retry after a kReadDone).
  virtual ErrorClass PostRead(ConnId conn, RegionId local, size_t local_offset,
                              const RemoteRegion& remote,
                              uint64_t remote_offset, size_t length,
                              uint64_t cookie) {
    (void)conn, (void)local, (void)local_offset, (void)remote;
    (void)remote_offset, (void)length, (void)cookie;
    return ErrorClass::kBadArg;
  }

  // ---- handover (a backend without sessions answers false) ----
  // This process's incarnation (FabricOptions::incarnation).
  virtual uint64_t Incarnation() const { return 0; }
  // The old process: every session into *out, when each can be carried: no
  // data frame of ours queued or unacknowledged, no header delivered whose
  // payload waits, no event not yet returned by Poll, no connection being
  // made. On success the fabric is handed over: it takes no more calls
  // (kBadConn), and destroying it (or the process ending) closes its
  // connections without ending their sessions, so the peers wait to
  // resume them; a backend whose peers would not see that (ofi: no end of
  // file over RDM) tells each one before it returns, and stops listening.
  // False with *why naming what is in flight: nothing changed, the fabric
  // serves on.
  virtual bool ExportSessions(std::vector<CarriedSession>* out,
                              std::string* why) {
    (void)out;
    *why = "this fabric has no sessions to carry";
    return false;
  }
  // The successor, on a fabric just opened with the predecessor's
  // incarnation and listen addresses, before any other call: each session
  // becomes a broken one that resumes (the dialler dials at once, the
  // other waits) or ends within timeout_ms as any broken session does
  // (kClosed). Checks what it is given (ids and nodes unique and non-zero,
  // not this node, addresses to dial); false with *why: nothing adopted.
  virtual bool AdoptSessions(const std::vector<CarriedSession>& sessions,
                             std::string* why) {
    (void)sessions;
    *why = "this fabric has no sessions to adopt";
    return false;
  }

  // One row per node seen (ordered by node id), node 0 first if any.
  virtual std::vector<PeerStats> Stats() const = 0;
  // How soon Poll must run again although no event fd fires (a broken
  // connection's next attempt to resume); -1: not before an event.
  virtual int NextWakeMs() const { return -1; }
};

// ---- addresses (shared by the backends) ----

struct ListenAddress {
  std::string host;  // numeric IPv4 or IPv6
  uint16_t port_lo = 0;
  uint16_t port_hi = 0;
};
// Parses "ADDR[:PORT[-PORT]]"; false with *error naming the problem.
bool ParseListenAddress(const std::string& text, ListenAddress* out,
                        std::string* error);

struct HostAddress {
  std::string host;
  uint16_t port = 0;
};
struct HostDescription {
  uint64_t node = 0;
  std::vector<HostAddress> addresses;  // tried in this order
};
// At most this many addresses in one description.
inline constexpr size_t kMaxHostAddresses = 16;

// A session handed from one process to its successor (a handover: psmctl
// upgrade, systemctl restart): what the successor needs to resume it with
// the peer, which sees the old process's connection break and keeps its
// side of the session (hw/link_fabric.h, Sessions) until then. Only a
// session with nothing of ours in flight is carried (ExportSessions), so
// the counters are all: the peer replays what we had not delivered.
struct CarriedSession {
  ConnId id = 0;          // the user's handle, kept
  uint64_t node = 0;      // the peer
  bool outgoing = false;  // we dialled it: the successor dials again
  std::vector<HostAddress> addresses;  // the peer's, to dial
  uint64_t peer_incarnation = 0;       // as the session opened
  uint64_t tx_seq = 0;        // our data frames, all delivered by the peer
  uint64_t rx_delivered = 0;  // the peer's data frames we delivered
};
std::string FormatHostDescription(const HostDescription& d);
bool ParseHostDescription(const std::string& text, HostDescription* out,
                          std::string* error);
// Whether `host` (numeric) is a loopback address (127/8 or ::1).
bool IsLoopback(const std::string& host);

}  // namespace psmd::hw

#endif  // PSMD_HW_FABRIC_H_
