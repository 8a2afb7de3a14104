// The state the inter-node engine (remote.h) keeps per peer node, per
// frame and per transfer: the definitions of Remote's private structs, and
// the limits they are held to. Private to Remote's .cc files (peers.cc,
// send.cc, receive.cc, flow_control.cc), which share it.
//
// Thread-safety: as Remote's; all of it is the progress worker's.
#ifndef PSMD_DAEMON_REMOTE_REMOTE_STATE_H_
#define PSMD_DAEMON_REMOTE_REMOTE_STATE_H_

#include <psm2.h>
#include <sys/uio.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "daemon/engine/mq_engine.h"
#include "daemon/remote/remote.h"
#include "daemon/remote/wire.h"
#include "shm/payload.h"
#include "shm/pool.h"
#include "shm/prefault.h"

namespace psmd {

// Frames queued to one node beyond which its senders are held.
inline constexpr size_t kMaxQueued = 1024;
// Receiving a payload nobody will take (its receiver is gone).
inline constexpr uint32_t kDiscardBytes = 64 * 1024;
// Bytes parked per connection (remote.h, back-pressure 4). What parks of
// one receiver is what its sender had in flight when kXoff reached it, at
// most the receiver's window and a frame (back-pressure 5, below).
inline constexpr uint64_t kParkMax = 16 << 20;
// Back-pressure 5 (remote.h): payload and chunk bytes (with their frame
// headers) to one receiving endpoint that a sending daemon has on the
// connection before that endpoint's daemon consumed them, and how often
// that daemon credits them back. The window is the sender's region (what a
// rendezvous stream had in flight with sessions already), so a stream does
// not feel it; it is checked before a frame, so a stalled receiver parks at
// most the window and one frame (a chunk, or a payload of at most
// hw::FabricLimits::max_payload). Envelopes do not count: they are small,
// the per-node queue (kMaxQueued) and kXoff bound them as before, and an
// 8-byte stream pays no lookup for them.
inline constexpr uint64_t kReceiverWindow = 8 << 20;
inline constexpr uint64_t kCreditEvery = kReceiverWindow / 8;

// The bytes of a frame (header and body of `length`) that count in its
// receiver's window: message and active-message payloads, rendezvous
// chunks; 0 for the other ops.
inline uint64_t WindowBytes(const hw::FrameFields& f, uint64_t length) {
  const wire::Op op = wire::OpOf(f);
  return op == wire::Op::kPayload || op == wire::Op::kRndvData
             ? hw::kFrameHeaderSize + length
             : 0;
}

inline uint64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline int ErrorOf(hw::ErrorClass e) {
  return e == hw::ErrorClass::kTimeout ? PSM2_TIMEOUT : PSM2_EPID_UNREACHABLE;
}

// The endpoint as the sender of a frame.
inline wire::Sender SenderOf(const Endpoint& ep) {
  wire::Sender s;
  s.epid = ep.epid();
  s.uid = ep.uid();
  std::memcpy(s.job, ep.job()->key().uuid.data(), sizeof(s.job));
  return s;
}

struct Remote::OutFrame {
  // An envelope (encoded into `bytes` when it is sent), or a data frame's
  // fields (msg.f) and the bytes it sends (iov).
  wire::Envelope msg;
  uint8_t bytes[wire::kEnvelopeMax] = {};
  iovec iov = {};
  // A pool chunk the frame sends from, released when the frame is done.
  uint8_t* chunk_base = nullptr;
  uint64_t chunk_offset = 0;
  std::shared_ptr<Job> chunk_job;  // keeps the pool mapped
  uint16_t node = 0;
  void ReleaseChunk() {
    if (chunk_base != nullptr) shm::ReleaseChunk(chunk_base, chunk_offset);
    chunk_base = nullptr;
    chunk_job.reset();
  }
};

struct Remote::Pending {
  wire::Envelope env;
  uint32_t receiver = 0;  // 0: discard the payload
  std::shared_ptr<Job> job;
  uint64_t chunk = 0;  // inbox offset the payload lands at
  bool matched = false;
  PostedRecv recv{};
  // The payload is kept in daemon memory (remote.h, back-pressure 3).
  bool keep = false;
  std::vector<uint8_t> kept;
};

// A payload kept in daemon memory for an unexpected message (remote.h,
// back-pressure 3), until its receive matches it or it is discarded.
struct Remote::Kept {
  hw::FrameFields f;  // of its envelope: sender, receiver, uid, job
  std::vector<uint8_t> bytes;
  uint64_t charged = 0;  // counted in Peer::parked_bytes
  bool waiting = false;  // unexpected: counted in Peer::kept_waiting
};

// An eager send to an endpoint that was off, sent as a rendezvous: its
// payload frame, from the sender's pool chunk, waits for the kRndvGo.
struct Remote::Converted {
  uint16_t node = 0;
  uint32_t sender = 0;  // endpoint id
  uint64_t req = 0;     // the sender's request (a sync send waits on it)
  bool sync = false;
  std::unique_ptr<OutFrame> payload;
};

// A frame parked for its receiving endpoint (remote.h, back-pressure 1).
struct Remote::Parked {
  bool chunk = false;  // a kRndvData chunk; else an envelope
  // The envelope as decoded, or the chunk's header (env.f).
  wire::Envelope env;
  std::vector<uint8_t> payload;  // its payload frame, or the chunk's bytes
  uint64_t bytes = 0;            // counted in Peer::parked_bytes
  uint64_t window = 0;           // its (and its payload frame's) WindowBytes
  // A receive the envelope had matched before it parked (Peer::has_held).
  bool has_held = false;
  uint32_t held_receiver = 0;
  PostedRecv held_recv{};
};

struct Remote::Peer {
  uint16_t node = 0;
  hw::ConnId conn = 0;
  bool open = false;
  uint64_t last_sent_ms = NowMs();
  uint64_t last_recv_ms = NowMs();
  std::deque<std::unique_ptr<OutFrame>> queue;
  // Requests (endpoint id, request) waiting for an answer from this node.
  std::set<std::pair<uint32_t, uint64_t>> awaiting;
  // Receiving.
  enum class Rx { kIdle, kHeader, kEnvelope, kPaused, kPayload, kChunk };
  Rx rx = Rx::kIdle;
  hw::FrameFields f;  // of the frame being received
  uint32_t length = 0;
  uint8_t env[wire::kEnvelopeMax] = {};  // an envelope as received
  wire::Envelope in;                     // and decoded
  bool expect_payload = false;
  Pending pending;
  // kChunk: the rendezvous chunk being received.
  uint64_t chunk_transfer = 0;
  uint64_t chunk_offset = 0;  // inbox offset; 0: discarded
  std::shared_ptr<Job> chunk_job;
  std::vector<uint8_t> discard;
  // A paused envelope's receive, taken from the posted queue (has_held).
  bool has_held = false;
  uint32_t held_receiver = 0;
  PostedRecv held_recv{};
  bool bad_logged = false;
  bool dropped = false;  // closed by us for a bad frame; kClosed follows
  // Parked frames by receiving epid, each list in arrival order, and kGone
  // frames waiting for the parked frames of their endpoint.
  std::unordered_map<uint64_t, std::deque<Parked>> parked;
  std::deque<wire::Envelope> gone_after;
  // Parked frames per sending epid: a kGone asks it on every pass while it
  // waits, so it must not cost a walk over every parked frame.
  std::unordered_map<uint64_t, uint32_t> parked_from;
  uint64_t parked_bytes = 0;
  bool park_payload = false;  // the payload being read is parked.back()'s
  bool park_chunk = false;    // so is the chunk being read
  bool park_full_logged = false;
  // Payloads kept for unexpected messages, by id (UnexpectedMsg::sender_id),
  // how many of them wait for a receive per receiving epid, and the matched
  // ones waiting for inbox space, as (transfer, bytes) in match order.
  std::unordered_map<uint32_t, Kept> kept;
  std::unordered_map<uint64_t, uint32_t> kept_waiting;
  std::deque<std::pair<uint64_t, std::vector<uint8_t>>> kept_chunks;
  uint32_t NextKeptId(uint32_t* next) {  // an id no kept payload has
    do {
      *next = *next + 1 == 0 ? 1 : *next + 1;
    } while (kept.count(*next) != 0);
    return *next;
  }
  // Sending: that node's endpoints that are off (kXoff), and the frames to
  // them set aside meanwhile, in queue order.
  std::set<uint64_t> off;
  std::unordered_map<uint64_t, std::deque<std::unique_ptr<OutFrame>>> deferred;
  // kGone frames of endpoints that have frames set aside above: each goes
  // once none of its endpoint's is left there (Remote::Resume).
  std::deque<std::unique_ptr<OutFrame>> gone_aside;
  // Its endpoints that take eager MQ messages as envelopes only
  // (kEagerOff): such a send goes as a rendezvous (Converted).
  std::set<uint64_t> eager_off;
  bool defer_payload = false;  // the next kPayload's envelope was set aside
  // Back-pressure 5: per endpoint of that node, the bytes of frames to it
  // posted and not yet credited back (sending), and per endpoint here the
  // bytes of its frames from that node consumed and not yet credited
  // (receiving).
  std::unordered_map<uint64_t, uint64_t> unconsumed;
  std::unordered_map<uint64_t, uint64_t> consumed;
};

// Reads of an RMA rendezvous (rma.cc) posted at once, in all: each holds
// an inbox chunk of its receiver's job until it is delivered.
inline constexpr uint32_t kMaxRmaReads = 16;
// The longest read (and inbox chunk) a piece is cut into, below the
// fabric's MaxReadLength and the inbox's largest chunk.
inline constexpr uint32_t kRmaReadMax = 1u << 20;
// How soon a read the provider ended with its peer is posted again.
inline constexpr uint64_t kReadRetryMs = 20;

// One read of a piece of an RMA rendezvous, into an inbox chunk of the
// receiver's job (rma.cc). Delivered in message order, as a chunk is.
struct Remote::RmaRead {
  enum class State { kWaiting, kPosted, kRead };
  State state = State::kWaiting;
  uint64_t piece = 0;          // the sender's name of the piece it is part of
  bool last_of_piece = false;  // the sender is told when this one is read
  uint64_t remote_offset = 0;  // in the sender's region
  uint32_t len = 0;
  uint64_t cookie = 0;  // kPosted: the fabric's read
  // kPosted, kRead: the inbox chunk it lands in (no job: nothing to read,
  // its receiver left).
  std::shared_ptr<Job> job;
  uint64_t chunk = 0;
};

struct Remote::InTransfer {  // a rendezvous receive from another node
  uint16_t node;
  uint32_t receiver;  // 0: gone, chunks are discarded
  uint64_t recv_req;
  uint64_t src;  // the sender's epid
  uint32_t send_bytes;
  uint32_t received;  // delivered to the receiver
  uint64_t sender_req;
  uint32_t accepted = 0;  // read off the connection (delivered or parked)
  // The RMA rendezvous (rma.cc): offered in the transfer id
  // (wire::kRmaOfferBit); then the receiving endpoint as a frame's sender,
  // the region the first kRndvRead named (every later one must name it),
  // and the reads of the pieces announced, in message order.
  bool rma = false;
  wire::Sender to{};
  bool has_region = false;
  wire::Region region{};
  std::deque<RmaRead> reads{};
  // Reads the provider ended with their peer are read again from
  // retry_at_ms on, until failing_since_ms is a fabric timeout old.
  uint64_t failing_since_ms = 0;
  uint64_t retry_at_ms = 0;
};

// A chunk of an RMA rendezvous announced to the receiving node (kRndvRead),
// held until it says it is done with it (kRndvReadDone) or goes.
struct Remote::OutPiece {
  uint16_t node = 0;
  uint64_t sender = 0;              // the sending endpoint's epid
  uint64_t receiver = 0;            // the receiving endpoint's epid
  std::unique_ptr<OutFrame> chunk;  // not sent: holds the pool chunk
};

// A job's pool registered with the fabric for RMA (rma.cc), once: read by
// peers where it sends, and read into where it receives. It holds the job
// (so the pool stays mapped while registered); SweepRegistrations
// deregisters it once nothing else does.
struct Remote::Registration {
  std::shared_ptr<Job> job;
  hw::RegionId id = 0;  // 0: registering failed, the job streams
  wire::Region remote;
  // Inbox chunks of reads that ended for us by a deadline or a connection
  // gone: the provider may still write into them until the region is not
  // busy (hw::Fabric::RegionBusy), so they are released only then.
  std::vector<uint64_t> quarantine;
};

struct Remote::OutTransfer {  // a rendezvous send to another node
  uint16_t node;
  uint32_t sender;
  uint64_t dst;
  uint64_t remote_transfer;
  uint32_t send_bytes;
  uint32_t forwarded;
  // The node went away or the receiver left: chunks are released as they
  // come (the sender was told).
  bool dead;
  uint64_t sender_req;
  wire::Sender from;  // the sending endpoint, for an abort
  // Its chunks go as kRndvRead pieces, read by the receiving daemon (the
  // receiver offered it and this job's pool is registered; rma.cc).
  bool rma = false;
};

// What this daemon keeps per job it moves bytes of: the inbox arena (if the
// job's pool has an inbox region) and the windows of the pool this
// process has mapped (shm/prefault.h): the socket reads into the inbox and
// writes from the senders' regions through this process's page tables.
struct Remote::JobPages {
  std::weak_ptr<Job> job;
  shm::Prefaulter pages;
  std::optional<shm::SendArena> inbox;
};

struct Remote::QueryState {
  uint16_t node;
  uint64_t deadline_ms;
  QueryDone done;
  // What was asked, to ask it again of the node's next run (a restart).
  wire::Sender from;
  uint64_t epid;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_REMOTE_REMOTE_STATE_H_
