// The engine's side of the fabric (hw/): how MQ and AM operations reach
// endpoints on other nodes, through their nodes' daemons. One connection per
// peer node carries every endpoint's traffic; each frame names the sending
// and receiving epids, the job uuid and uid (frame fields), and the daemon
// that receives it delivers only to an endpoint of that epid, job and uid.
//
// Frames (their ops, traits, builders and decoders: daemon/remote/wire.h):
// every op but kPayload and kRndvData is an *envelope*, a 32-byte record
// (plus up to kInlineMax payload bytes) read into a fixed buffer and decoded
// (a frame the decoder refuses drops the connection); the engine
// decides from it where the next frame's payload goes (a receive matched
// now, or an unexpected message the receiver's budgets admit:
// MqEngine::Arrive with Part::kEnvelope), and only then posts the next
// receive. A payload lands once, in the receiving job's
// inbox region of its pool (Job::InboxRegion), which its client reads and
// releases as it does a local sender's chunk. A rendezvous chunk is sent
// from the sender's pool chunk and received into an inbox chunk.
//
// Back-pressure, per receiving endpoint (one tenant's slow receiver must
// not stall the others that share the connection):
//   1. A message or chunk that finds its receiver over its unexpected
//      budget, its target's completion overflow full, or (a chunk or an
//      active message) its job's inbox full is *parked*: its envelope and
//      payload are read into daemon memory, queued per receiving epid, and
//      retried on every pass. Every later message or chunk for that epid
//      parks behind it (per-flow order); a kGone waits for the parked
//      frames of its endpoint.
//   2. The first frame parked for an epid sends kXoff(epid) to the sending
//      node; the last one delivered sends kXon. While an epid is off, its
//      node's daemon holds new sends and active-message requests to it (in
//      the senders' held_sends, mq_engine.h invariant 4) and sets aside the
//      queued frames for it (Peer::deferred), so what is parked is bounded
//      by what was in flight when kXoff arrived.
//   3. An eager MQ message that may stay unexpected gets at most half of
//      its job's inbox (shm/pool.h, ChunkUse::kMayLinger), so that the
//      messages and chunks receives wait for always find room. When that
//      share (or the inbox) has refused space for shm::kPoolStallNs (the
//      message parks meanwhile, as in 1), its payload is *kept*: read into
//      daemon memory, while its envelope enters the matcher at once as a
//      rendezvous whose sender is this daemon (UnexpectedMsg::sender_id
//      names the kept payload); when matched, the payload moves to the
//      inbox as one rendezvous chunk. The first payload kept waiting for
//      an epid sends kEagerOff(epid), the last one matched kEagerOn; in
//      between the sending daemon sends eager MQ messages to it as
//      envelopes only: rendezvous ones whose payload stays in the sender's
//      pool chunk until the receiver asks (Converted), including the ones
//      it had queued. So a message the receiver waits for never waits
//      behind ones it has not asked for, and what is kept is bounded by
//      what was in flight when kEagerOff arrived.
//   4. Parked and kept bytes per connection are capped (kParkMax); past the
//      cap the connection pauses as a whole (nothing more is read until the
//      frame fits, TCP holds the sender back): the last resort against a
//      peer that ignores kXoff or kEagerOff, logged once.
//   5. A window per receiving endpoint: a sending daemon posts to the
//      fabric at most kReceiverWindow bytes (payload and chunk frames) to
//      one endpoint that its daemon has not yet *consumed* (handled, or
//      delivered out of the park); beyond, that endpoint's frames are set
//      aside as in 2 and
//      new sends to it held, until a kXon returns credit (its x: bytes
//      consumed, sent every kCreditEvery, and with the kXon that ends a
//      park). So what one receiver can have on the connection, in the
//      sockets' buffers included, and then parked is bounded whatever the
//      fabric's own window (without sessions kSendDone comes once the
//      kernel took the bytes) and however late kXoff arrives: one stalled
//      receiver cannot fill the park and pause the connection for the
//      others.
// Frames to a node wait in a bounded per-node queue; a send to a node whose
// queue is full is held likewise, so the worker never blocks and nothing is
// dropped.
//
// Failure: a connection that closes fails every request waiting for an
// answer from that node (sync and rendezvous sends, acknowledged active
// messages, connect queries, rendezvous receives in progress, and posted
// receives naming an endpoint there) with PSM2_EPID_UNREACHABLE at once
// (PSM2_TIMEOUT when the peer fell silent), and tells every endpoint that
// had connected to one there (kNodeLost), since its receives from any
// source cannot fail; the next psm2_ep_connect reconnects.
//
// A Remote sits beside its MqEngine (the progress worker owns both): the
// engine calls it for peers on other nodes (the hooks below), and it
// reaches the engine only through the engine's public surface.
//
// One class, its code by concern: peers.cc (connections, failure,
// liveness), send.cc, receive.cc (a handler per op), flow_control.cc (the
// back-pressure rules above), rma.cc (rendezvous chunks read by RMA where
// the fabric can: docs/design.md, "Rendezvous by RMA read"); its private
// state is remote_state.h's, the frames wire.h's, the node table
// node_table.h's.
//
// With engine shards the Remote is shard 0's and serves every shard's
// endpoints (mq_engine.h, invariant 12): it finds them with
// MqEngine::FindAny, reads only the identity of another shard's, and
// reaches it through the engine (PostFor, ArriveAcross, AmArriveAcross:
// such a receiver takes a message whole, on its shard, and at most
// kFabricCredit of them may be in flight to it; its frames wait in
// back-pressure 1 beyond).
//
// Thread-safety: a Remote belongs to one progress worker; every method runs
// on the worker thread.
#ifndef PSMD_DAEMON_REMOTE_REMOTE_H_
#define PSMD_DAEMON_REMOTE_REMOTE_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "daemon/engine/endpoint.h"
#include "daemon/engine/other_nodes.h"
#include "daemon/handover/state_codec.h"
#include "daemon/remote/node_table.h"
#include "daemon/remote/proxy_ids.h"
#include "daemon/remote/wire.h"
#include "hw/fabric.h"
#include "proto/counters.h"
#include "shm/payload.h"
#include "shm/pool.h"
#include "shm/status.h"

namespace psmd {

class MqEngine;

class Remote : public OtherNodes {
 public:
  Remote(MqEngine* engine, std::unique_ptr<hw::Fabric> fabric, uint16_t node_id,
         uint16_t boot_nonce, std::string nodes_file, uint32_t timeout_ms);
  ~Remote() override;

  int event_fd() const { return fabric_->event_fd(); }
  // Dispatches fabric events and retries paused receives; true when
  // anything was done.
  bool Poll();
  // The longest the worker may sleep (ms) with work only time can unpause
  // (an inbox waiting for its client to release chunks, query deadlines);
  // -1: no limit.
  int SleepLimitMs();

  // psm2_ep_connect to `epid` on another node: connects to its node if
  // needed and asks its daemon whether `ep`'s job and uid have that
  // endpoint. `done` runs once, on the worker thread, with a psm2_error_t.
  using QueryDone = std::function<void(int error, const std::string& why)>;
  void Query(const Endpoint& ep, uint64_t epid, QueryDone done);
  // The node table's host name of `node`, or "" if the table has no line
  // for it.
  std::string HostName(uint16_t node) const { return nodes_.HostName(node); }

  // OtherNodes: the engine's calls (daemon/engine/other_nodes.h).
  bool Send(Endpoint& sender, const shm::SubmissionDesc& d, const PeerLink& to,
            bool may_hold) override;
  bool AmRequest(Endpoint& sender, const shm::SubmissionDesc& d,
                 const PeerLink& to, bool may_hold) override;
  void AmReplyOrAck(Endpoint& sender, const shm::SubmissionDesc& d) override;
  bool RndvData(Endpoint& sender, const shm::SubmissionDesc& d) override;
  void CompleteSync(const Endpoint& receiver, const UnexpectedMsg& m,
                    int32_t error) override;
  void StartTransfer(Endpoint& receiver, uint64_t recv_req, uint32_t send_bytes,
                     const UnexpectedMsg& m) override;
  void EndpointRemoved(uint32_t id) override;

  // This engine's counters per peer node, one per entry of
  // PSMD_REMOTE_EVENT_COUNTERS (proto/counters.h): frames it refused (no
  // endpoint of that epid, job and uid here), frames from that node it
  // parked, kXoff from it, its payloads kept here, kEagerOff from it, its
  // connections dropped for a frame the engine refused; and
  // PSMD_REMOTE_RMA_COUNTERS: RMA reads from its pool and their bytes.
  struct PeerCounts {
#define PSMD_PEER_COUNTS_FIELD(name, column, unit, help) uint64_t name = 0;
    PSMD_REMOTE_EVENT_COUNTERS(PSMD_PEER_COUNTS_FIELD)
    PSMD_REMOTE_RMA_COUNTERS(PSMD_PEER_COUNTS_FIELD)
#undef PSMD_PEER_COUNTS_FIELD
  };
  // The fabric's rows per peer node, each with this engine's counts.
  struct PeerRow {
    hw::PeerStats fabric;
    PeerCounts counts;
  };
  std::vector<PeerRow> Stats() const;

  // ---- a handover (remote_handover.cc; docs/design.md, "Handover with a
  // fabric") ----
  // Whether what this Remote holds can be carried (the workers frozen,
  // polled until nothing moves); else false with *why naming what is in
  // flight.
  bool Carriable(std::string* why) const;
  // What the last Poll that did anything did, for the drain's log line
  // while rounds keep moving things ("a frame of op 7 from node 2").
  std::string LastActivity();
  // The first step, while the clients still run: asks each node that
  // connected to an endpoint here to hold its messages to it (kXoff, as a
  // parked receiver does), so that what arrives during the drain is only
  // what was in flight; credits (back-pressure 5) wait meanwhile. Released
  // (kXon, with the credits) by the successor once it took over, or by
  // this psmd if the handover failed; an endpoint with frames parked here
  // stays off until they are taken, as ever. PeersHeld: every kXoff was
  // taken and nothing came from another node for kHeldQuietMs (what was
  // in flight when the peers took the kXoffs has arrived): the workers may
  // freeze. (What waits here for clients, parked or kept, is carried.)
  void HoldPeers(bool hold);
  bool PeersHeld() const;
  static constexpr uint64_t kHeldQuietMs = 2;
  // Once Carriable: its state, for LoadState in the successor.
  void SaveState(handover::StateWriter& w) const;
  // Into a successor's Remote whose fabric adopted the old one's sessions
  // (`sessions`: their ids and nodes) and whose engines loaded theirs:
  // checked whole before anything changes (the state is untrusted).
  Status LoadState(handover::StateReader& r,
                   const std::map<hw::ConnId, uint64_t>& sessions);
  // The fabric, for the handover's session export.
  hw::Fabric& fabric() { return *fabric_; }
  // A successor's registry took the old psmd's epids, whose boot nonce
  // frames name (Target).
  void set_boot_nonce(uint16_t nonce) { boot_nonce_ = nonce; }

 private:
  struct OutFrame;
  struct Peer;
  struct Pending;  // an envelope whose payload frame comes next
  struct InTransfer;
  struct OutTransfer;
  struct JobPages;
  struct QueryState;
  struct Parked;
  struct Kept;
  struct Converted;
  struct RmaRead;
  struct OutPiece;
  struct Registration;
  enum class Verdict { kDone, kPause };

  // ---- peers and liveness (peers.cc) ----
  Peer* PeerOf(uint16_t node);
  Peer* PeerOfConn(hw::ConnId conn);
  void HandleEvent(const hw::Event& e);
  void RecvNext(Peer& p);
  // Closes p's connection for a frame the engine refuses (`why`).
  void Drop(Peer& p, const char* why);
  void FailPeer(uint16_t node, hw::ErrorClass why);
  void CheckDeadlines();
  // Heartbeats: a ping to every open peer sent nothing for a third of the
  // timeout; a peer heard nothing from for the whole timeout while we were
  // reading (not paused) is dead. TCP_USER_TIMEOUT cannot be used for this:
  // it also kills a connection whose receiver paused (zero window) longer.
  // Time this worker did not run (a gap between checks over a third of the
  // timeout, less one idle period) does not count as a peer's silence.
  void CheckLiveness();
  void Refused(uint16_t node, const hw::FrameFields& f, const char* what);

  // ---- sending (send.cc) ----
  void Enqueue(Peer& p, std::unique_ptr<OutFrame> f);
  // Queues envelope `e` to p, or to `node` if connected.
  void Post(Peer& p, const wire::Envelope& e);
  void PostTo(uint16_t node, const wire::Envelope& e);
  void Flush(Peer& p);
  // An active-message request or reply of `sender` from submission d:
  // its envelope, carrying an inline payload or followed by the payload's
  // frame; one that wants an ack is remembered until the ack comes.
  void SendAm(Peer& p, bool reply, const Endpoint& sender, uint64_t dst,
              const shm::SubmissionDesc& d, shm::PoolPayload* payload,
              uint32_t wire_flags);
  // A data frame with header `fields` sending the pool chunk `payload`
  // (len bytes, now the frame's until its send completes).
  std::unique_ptr<OutFrame> ChunkFrame(const Endpoint& sender,
                                       const hw::FrameFields& fields,
                                       shm::PoolPayload* payload, uint32_t len);
  // The kPayload frame that follows an envelope.
  std::unique_ptr<OutFrame> PayloadFrame(const Endpoint& sender, uint64_t dst,
                                         uint64_t req,
                                         shm::PoolPayload* payload,
                                         uint32_t len);
  // kSyncAck (error PSM2_OK) or kError for the sender of `m`.
  void TellSender(const Endpoint& receiver, const UnexpectedMsg& m,
                  int32_t error);

  // ---- receiving (receive.cc) ----
  // A frame's header: checked (wire::CheckHeader), then its data handler
  // places its bytes, or its envelope is read into p.env.
  void OnHeader(Peer& p, const hw::Event& e);
  // Reads the frame's `length` bytes into `to`, or drops them (null).
  void ReadBody(Peer& p, uint8_t* to, uint32_t length);
  // Where the bytes of the frame parked last for `dst` go.
  uint8_t* ParkedBody(Peer& p, uint64_t dst, uint32_t length);
  void OnRecvDone(Peer& p, const hw::Event& e);
  // The handlers, a row per wire::Op (kHandlers, row for row with
  // wire::kOpTraits). A data op's decides where the frame's bytes go; an
  // envelope's decides the decoded envelope and may pause it (kPause: it
  // is parked or, past kParkMax, the connection pauses; retried).
  using DataHandler = void (Remote::*)(Peer& p, const hw::Event& e);
  using EnvelopeHandler = Verdict (Remote::*)(Peer& p,
                                              const wire::Envelope& in);
  struct Handler {
    wire::Shape shape = wire::Shape::kNone;  // of the op it handles
    DataHandler data = nullptr;
    EnvelopeHandler envelope = nullptr;
  };
  // A row of kHandlers: its shape follows from its handler's (and a null
  // handler is no row: ambiguous).
  static constexpr Handler On(DataHandler h) {
    return {wire::Shape::kData, h, nullptr};
  }
  static constexpr Handler On(EnvelopeHandler h) {
    return {wire::Shape::kEnvelope, nullptr, h};
  }
  static const Handler kHandlers[wire::kOpCount];
  // Whether every op's row has a handler of the op's shape (a static_assert
  // in OnHeader).
  static constexpr bool EveryOpHasItsHandler();
  void OnPayloadHeader(Peer& p, const hw::Event& e);
  void OnChunkHeader(Peer& p, const hw::Event& e);
  Verdict OnQuery(Peer& p, const wire::Envelope& in);
  Verdict OnAnswer(Peer& p, const wire::Envelope& in);
  Verdict OnMessage(Peer& p, const wire::Envelope& in);
  Verdict OnSendAnswer(Peer& p, const wire::Envelope& in);  // kSyncAck, kError
  Verdict OnRndvGo(Peer& p, const wire::Envelope& in);
  Verdict OnActiveMessage(Peer& p, const wire::Envelope& in);
  Verdict OnAmAck(Peer& p, const wire::Envelope& in);
  Verdict OnAbort(Peer& p, const wire::Envelope& in);
  Verdict OnPing(Peer& p, const wire::Envelope& in);
  Verdict OnGone(Peer& p, const wire::Envelope& in);
  // Its handler's verdict on `in`.
  Verdict Handle(Peer& p, const wire::Envelope& in);
  // The receiver of message or active message `in`; when there is none,
  // refuses it (its payload, if one follows, is read and dropped).
  Endpoint* Receiver(Peer& p, const wire::Envelope& in);
  // A payload (of the envelope in p.pending) landed in its inbox chunk.
  void OnPayload(Peer& p);
  // Active message `c` from another node reaches `r`, of this shard or
  // (MqEngine::AmArriveAcross) another.
  void PostAm(Endpoint& r, const shm::CompletionDesc& c);
  // A rendezvous chunk of `transfer_id` landed in `job`'s inbox at `chunk`.
  void OnChunk(uint64_t transfer_id, const std::shared_ptr<Job>& job,
               uint64_t chunk, uint32_t len);
  // The local endpoint a frame is for: epid, job and uid all match.
  Endpoint* Target(const hw::FrameFields& f);
  // This daemon's state for `job`'s pool, made on first use.
  JobPages& PagesOf(const std::shared_ptr<Job>& job);
  // Allocates `bytes` in the inbox of `ep`'s job; false when full (or, for
  // kMayLinger, when lingering chunks hold their share: shm/pool.h).
  bool AllocInbox(Endpoint& ep, uint32_t bytes, uint64_t* offset,
                  shm::ChunkUse use = shm::ChunkUse::kBrief);

  // ---- flow control, back-pressure 1-4 above (flow_control.cc) ----
  // Handle, unless frames parked before it must go first.
  Verdict Admit(Peer& p, const wire::Envelope& in);
  // The envelope in p.in (or, with `chunk`, the rendezvous chunk whose
  // header is p.f) waits in p.parked; its payload, if any, is read next
  // into daemon memory. False: over kParkMax, pause the connection instead.
  bool Park(Peer& p, bool chunk);
  // Retries the parked frames of every epid in order; true when any went.
  bool RetryParked(Peer& p);
  bool Deliver(Peer& p, Parked& e);
  // Copies a chunk of `transfer_id` held in daemon memory into its
  // receiver's inbox (or drops it if the receiver left); false when the
  // inbox is full.
  bool DeliverChunk(uint64_t transfer_id, const std::vector<uint8_t>& bytes);
  Verdict OnXoff(Peer& p, const wire::Envelope& in);
  Verdict OnXon(Peer& p, const wire::Envelope& in);
  // Whether Flush sets `f` aside for a node's endpoint that is off (kXoff)
  // or has its window full (back-pressure 5).
  bool Defer(Peer& p, const OutFrame& f);
  // Whether frames to p's endpoint `dst` wait: it is off, its window is
  // full, or frames to it are set aside already (they go first).
  static bool Held(const Peer& p, uint64_t dst);
  // Whether frames from this node's endpoint `src` are set aside for p.
  static bool SetAsideFrom(const Peer& p, uint64_t src);
  // Flush posted `f`: its bytes count in its receiver's window.
  static void Charge(Peer& p, const OutFrame& f);
  // The frames set aside for `dst` go again, unless it is still held.
  void Resume(Peer& p, uint64_t dst);
  // This daemon consumed `bytes` of p's frames to endpoint f.dst (the
  // frame f's receiver): credited back to p's daemon every kCreditEvery,
  // or with the kXon that ends that endpoint's park.
  void Consumed(Peer& p, const hw::FrameFields& f, uint64_t bytes);
  // Makes the record `r` of an eager MQ send of `sender` (its request
  // `req`) to an endpoint that is off a rendezvous one; its payload frame
  // waits in converted_ for kRndvGo. Returns the id the envelope's aux
  // carries instead of req.
  uint64_t Convert(Peer& p, uint32_t sender, uint64_t req, wire::Record* r,
                   std::unique_ptr<OutFrame> payload);
  // Converts the eager envelopes to `dst` in `queue` (kEagerOff).
  void ConvertQueued(Peer& p, std::deque<std::unique_ptr<OutFrame>>& queue,
                     uint64_t dst);
  // Releases the payloads of the converted sends `drop` selects, and
  // forgets them.
  void DropConverted(const std::function<bool(const Converted&)>& drop);
  // kRndvGo, kError or kSyncAck `in` for a converted send of `t`.
  void OnConverted(Peer& p, const wire::Envelope& in, Endpoint& t);
  Verdict OnEagerOff(Peer& p, const wire::Envelope& in);
  Verdict OnEagerOn(Peer& p, const wire::Envelope& in);
  // Takes the kept payload `m` names out of its peer; false when it is
  // gone with its connection.
  bool TakeKept(const UnexpectedMsg& m, std::vector<uint8_t>* bytes);
  // A matched kept payload (m.sender_id) goes to its receiver as one
  // rendezvous chunk of send_bytes.
  void DeliverKept(Endpoint& receiver, uint64_t recv_req, uint32_t send_bytes,
                   const UnexpectedMsg& m);
  // Delivers p's matched kept payloads in order while the inbox has room;
  // true when any went.
  bool DeliverKeptChunks(Peer& p);

  // ---- the RMA rendezvous (rma.cc; docs/design.md, "Rendezvous by RMA
  // read") ----
  // `job`'s pool registered with the fabric, made on first use; null when
  // the fabric cannot read or registering failed (the job streams).
  const Registration* RegistrationOf(const std::shared_ptr<Job>& job);
  // Whether a transfer to `receiver` is offered as RMA (kRmaOfferBit).
  bool OfferRma(const Endpoint& receiver);
  // Whether a transfer from `sender` whose kRndvGo carried transfer id `x`
  // goes as RMA.
  bool UseRma(const Endpoint& sender, uint64_t x);
  // A chunk of RMA transfer t (the client's kRndvData d, `chunk` its pool
  // payload) announced to its receiver's node.
  void AnnouncePiece(Peer& p, OutTransfer& t, const Endpoint& sender,
                     const shm::SubmissionDesc& d, shm::PoolPayload* chunk);
  Verdict OnRndvRead(Peer& p, const wire::Envelope& in);
  Verdict OnRndvReadDone(Peer& p, const wire::Envelope& in);
  void OnReadDone(const hw::Event& e);
  // Read `read` of transfer `id` ended with `e`: posted again shortly or
  // the transfer fails (FailRead).
  void RetryOrFailRead(uint64_t id, RmaRead* read, hw::ErrorClass e);
  // Whether t's reads may go again (kReadRetryMs from now): not once they
  // have failed for a fabric timeout.
  bool ReadAgainLater(InTransfer& t);
  // Posts the reads that wait (for a slot, or inbox space); true when any
  // went.
  bool PumpReads();
  // Delivers transfer `id`'s reads that landed, in order (OnChunk), and
  // tells the sender each piece read whole.
  void DeliverReads(uint64_t id);
  // Ends RMA transfer `id` with `error` (a read failed): its receive fails,
  // its sender is told, its reads end.
  void FailRead(uint64_t id, int32_t error);
  // Ends t's reads that are not posted (their chunks released) and tells
  // the sender it is done with each piece not told yet (with `error`,
  // when `tell`); posted ones end with their kReadDone.
  void EndReads(InTransfer& t, int32_t error, bool tell);
  void TellPieceDone(const InTransfer& t, uint64_t piece, uint32_t len,
                     int32_t error);
  // Releases, or keeps until the provider is done with the region (a read
  // ended by its deadline or its connection may still write), inbox chunk
  // `chunk` of `job`.
  void ReleaseReadChunk(const std::shared_ptr<Job>& job, uint64_t chunk,
                        bool provider_may_write);
  // Deregisters the pools only this cache holds, and releases quarantined
  // chunks the provider is done with.
  void SweepRegistrations();

  MqEngine* const engine_;
  std::unique_ptr<hw::Fabric> fabric_;
  const uint16_t node_id_;
  uint16_t boot_nonce_;  // the registry's (a successor's: the old one's)
  const uint32_t timeout_ms_;
  NodeTable nodes_;

  std::unordered_map<uint16_t, std::unique_ptr<Peer>> peers_;
  std::unordered_map<hw::ConnId, uint16_t> node_of_conn_;
  std::unordered_map<uint64_t, std::unique_ptr<OutFrame>> in_flight_;
  uint64_t next_cookie_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<QueryState>> queries_;
  uint64_t next_query_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<InTransfer>> in_transfers_;
  uint64_t next_in_transfer_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<OutTransfer>> out_transfers_;
  std::unordered_map<uint64_t, Converted> converted_;  // by id (with the bit)
  uint64_t next_converted_ = 1;
  uint32_t next_kept_ = 1;
  // Per local endpoint, the nodes that connected to it (a kQuery it
  // answered OK): told kGone when it is removed, so their receives naming
  // it fail (mq_engine.h invariant 8). At most one entry per node.
  std::unordered_map<uint32_t, std::set<uint16_t>> watchers_;
  std::unordered_map<const Job*, std::unique_ptr<JobPages>> job_pages_;
  // The RMA rendezvous: registered pools by job, pieces announced and not
  // yet done by id, transfers with reads waiting, posted reads by cookie.
  std::unordered_map<const Job*, std::unique_ptr<Registration>> registrations_;
  std::unordered_map<uint64_t, OutPiece> out_pieces_;
  uint64_t next_piece_ = 1;
  std::set<uint64_t> rma_waiting_;
  struct PostedRead {
    uint64_t transfer;
    uint16_t node;
    std::shared_ptr<Job> job;
    uint64_t chunk;
  };
  std::unordered_map<uint64_t, PostedRead> rma_posted_;
  uint64_t next_read_ = 1;
  ProxyIds proxies_;
  bool holding_ = false;  // HoldPeers
  uint32_t passes_ = 0;
  // LastActivity: the last fabric event of a Poll while the peers are held
  // (a handover's drain), and whether the last Poll that did anything had
  // any (else parked or paused frames moved).
  hw::Event last_event_;
  bool last_poll_had_events_ = false;
  uint64_t last_liveness_ms_ = 0;
  uint64_t refused_ = 0;
  std::map<uint16_t, PeerCounts> counts_by_node_;
};

}  // namespace psmd

#endif  // PSMD_DAEMON_REMOTE_REMOTE_H_
