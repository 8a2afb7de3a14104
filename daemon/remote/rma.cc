// Remote: the rendezvous by RMA read (docs/design.md, "Rendezvous by RMA
// read"). Where the fabric can read (hw::Fabric::CanRead: the ofi backend
// on a provider with FI_RMA|FI_READ), a rendezvous chunk the sending client
// publishes in its pool is not streamed through the daemons: the sending
// daemon announces it (kRndvRead: where it lies in the job's pool, which
// it registered once), the receiving daemon reads it with PostRead straight
// into an inbox chunk of the receiver's job (whose pool it registered
// once), delivers it as a streamed chunk is delivered (OnChunk: the
// engine and the client see no difference), and tells the sender
// (kRndvReadDone), which releases the chunk.
//
// Agreement: the receiving daemon offers it in the transfer id of its
// kRndvGo (wire::kRmaOfferBit, wire.h says why that needs no handshake),
// and the sending daemon takes it if it can serve reads; otherwise the
// transfer streams, as over sockets.
//
// Nothing from the peer is trusted: a kRndvRead must name a transfer this
// daemon offered to that node and sending endpoint, for the receiving
// endpoint, job and uid the transfer has, at the next offset of the
// message and within its length, and the same region as the transfer's
// first piece (wire.h checks the piece lies within that region); the
// provider checks the key. A read that fails (a forged key, a dead peer,
// the fabric's deadline) fails the receive and tells the sender, as a
// streamed rendezvous fails.
#include <psm2.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <spdlog/spdlog.h>

#include "daemon/remote/remote_state.h"
#include "shm/epid.h"

namespace psmd {

const Remote::Registration* Remote::RegistrationOf(
    const std::shared_ptr<Job>& job) {
  if (!fabric_->CanRead()) return nullptr;
  auto& slot = registrations_[job.get()];
  if (!slot) {
    slot = std::make_unique<Registration>();
    slot->job = job;
    hw::RemoteRegion remote;
    const hw::ErrorClass e = fabric_->RegisterRegion(
        job->pool().base(), job->pool().size(), &slot->id, &remote);
    if (e != hw::ErrorClass::kOk) {
      // Its transfers stream; tried again once the job is gone.
      spdlog::warn(
          "fabric: cannot register a pool of uid {} ({} bytes) for RMA "
          "reads ({}); its job's rendezvous messages stream",
          job->key().uid, job->pool().size(), hw::ErrorClassName(e));
      slot->id = 0;
    }
    slot->remote = {remote.addr, remote.key, remote.length};
  }
  return slot->id != 0 ? slot.get() : nullptr;
}

void Remote::SweepRegistrations() {
  for (auto it = registrations_.begin(); it != registrations_.end();) {
    Registration& r = *it->second;
    if (!r.quarantine.empty() && !fabric_->RegionBusy(r.id)) {
      for (uint64_t chunk : r.quarantine) {
        shm::ReleaseChunk(r.job->pool().base(), chunk);
      }
      r.quarantine.clear();
    }
    // Held by this cache alone: the job's endpoints are gone, and so is
    // every piece and read of it (they hold the job too).
    if (r.job.use_count() == 1 &&
        (r.id == 0 || fabric_->DeregisterRegion(r.id) == hw::ErrorClass::kOk)) {
      it = registrations_.erase(it);  // the pool may be unmapped now
      continue;
    }
    ++it;
  }
}

bool Remote::OfferRma(const Endpoint& receiver) {
  return RegistrationOf(receiver.job()) != nullptr;
}

bool Remote::UseRma(const Endpoint& sender, uint64_t x) {
  return (x & wire::kRmaOfferBit) != 0 &&
         RegistrationOf(sender.job()) != nullptr;
}

void Remote::AnnouncePiece(Peer& p, OutTransfer& t, const Endpoint& sender,
                           const shm::SubmissionDesc& d,
                           shm::PoolPayload* chunk) {
  const Registration* reg = RegistrationOf(sender.job());
  const uint64_t id = next_piece_++;
  OutPiece& piece = out_pieces_[id];
  piece.node = t.node;
  piece.sender = sender.epid();
  piece.receiver = t.dst;
  // The chunk is not sent: the frame holds it (and the job, so the pool
  // stays mapped and registered) until the receiver is done with it.
  piece.chunk = ChunkFrame(sender, hw::FrameFields{}, chunk, d.len);
  Post(p, wire::PrepRndvRead(SenderOf(sender), t.dst, t.remote_transfer,
                             d.body.rndv.offset, id, d.len,
                             piece.chunk->chunk_offset, reg->remote));
}

Remote::Verdict Remote::OnRndvReadDone(Peer& p, const wire::Envelope& in) {
  auto it = out_pieces_.find(in.f.aux);
  // (One already released: its sender left, or the connection before.)
  if (it == out_pieces_.end() || it->second.node != p.node ||
      it->second.sender != in.f.dst || it->second.receiver != in.f.src) {
    return Verdict::kDone;
  }
  it->second.chunk->ReleaseChunk();
  out_pieces_.erase(it);
  return Verdict::kDone;
}

Remote::Verdict Remote::OnRndvRead(Peer& p, const wire::Envelope& in) {
  const hw::FrameFields& f = in.f;
  auto it = in_transfers_.find(f.aux);
  if (it == in_transfers_.end()) {
    // A piece in flight when the transfer failed here: the sender is told
    // so it releases it. Any other is refused.
    if ((f.aux & wire::kRmaOfferBit) != 0 &&
        (f.aux & ~wire::kRmaOfferBit) < next_in_transfer_) {
      Post(p,
           wire::PrepRndvReadDone(wire::ReceiverOf(f), f.src, wire::PieceOf(in),
                                  0, PSM2_EPID_UNREACHABLE));
      return Verdict::kDone;
    }
    Drop(p, "RMA piece of no transfer");
    return Verdict::kDone;
  }
  InTransfer& t = *it->second;
  const wire::Region region = wire::RegionOf(in);
  // (Not into a transfer that streamed chunks: one may still be parked,
  // and would reach the receiver after the reads.)
  if (!t.rma || (t.accepted != 0 && !t.has_region) || t.node != p.node ||
      t.src != f.src || t.to.epid != f.dst || t.to.uid != f.uid ||
      std::memcmp(t.to.job, f.job, sizeof(f.job)) != 0 ||
      f.offset != t.accepted || in.r.len > t.send_bytes - t.accepted ||
      (t.has_region &&
       (region.addr != t.region.addr || region.key != t.region.key ||
        region.length != t.region.length))) {
    Drop(p, "RMA piece not of its transfer, or out of order");
    return Verdict::kDone;
  }
  t.has_region = true;
  t.region = region;
  t.accepted += in.r.len;
  Endpoint* r = t.receiver == 0 ? nullptr : engine_->FindAny(t.receiver);
  const JobPages* pages = r == nullptr ? nullptr : &PagesOf(r->job());
  if (pages == nullptr || !pages->inbox) {
    // Nothing to read into: the piece counts as delivered, in its turn,
    // and goes back.
    RmaRead discard;
    discard.state = RmaRead::State::kRead;
    discard.piece = wire::PieceOf(in);
    discard.last_of_piece = true;
    discard.len = in.r.len;
    t.reads.push_back(std::move(discard));
    DeliverReads(f.aux);
    return Verdict::kDone;
  }
  // Cut into reads the fabric and the inbox take whole.
  const uint64_t most = std::min<uint64_t>(
      {kRmaReadMax, fabric_->MaxReadLength(), pages->inbox->MaxPayload()});
  uint32_t done = 0;
  while (done < in.r.len) {
    RmaRead read;
    read.piece = wire::PieceOf(in);
    read.remote_offset = in.r.x + done;
    read.len = static_cast<uint32_t>(std::min<uint64_t>(in.r.len - done, most));
    done += read.len;
    read.last_of_piece = done == in.r.len;
    t.reads.push_back(std::move(read));
  }
  rma_waiting_.insert(f.aux);
  PumpReads();
  return Verdict::kDone;
}

bool Remote::PumpReads() {
  if (rma_waiting_.empty()) return false;
  bool did = false;
  const std::vector<uint64_t> ids(rma_waiting_.begin(), rma_waiting_.end());
  for (uint64_t id : ids) {
    auto it = in_transfers_.find(id);
    Peer* p = it == in_transfers_.end() ? nullptr : PeerOf(it->second->node);
    if (p == nullptr) {  // ended meanwhile (FailPeer ended its reads)
      rma_waiting_.erase(id);
      continue;
    }
    InTransfer& t = *it->second;
    Endpoint* r = t.receiver == 0 ? nullptr : engine_->FindAny(t.receiver);
    const Registration* reg = r == nullptr ? nullptr : RegistrationOf(r->job());
    bool blocked = t.retry_at_ms != 0 && NowMs() < t.retry_at_ms;
    if (blocked) continue;
    int32_t failed = PSM2_OK;
    for (RmaRead& read : t.reads) {
      if (read.state != RmaRead::State::kWaiting) continue;
      if (r == nullptr || reg == nullptr) {  // its receiver left: no read
        read.state = RmaRead::State::kRead;
        continue;
      }
      uint64_t chunk = 0;
      if (rma_posted_.size() >= kMaxRmaReads ||
          !AllocInbox(*r, read.len, &chunk)) {
        blocked = true;
        break;
      }
      const uint64_t cookie = next_read_++;
      const hw::ErrorClass e = fabric_->PostRead(
          p->conn, reg->id, chunk,
          hw::RemoteRegion{t.region.addr, t.region.key, t.region.length},
          read.remote_offset, read.len, cookie);
      if (e != hw::ErrorClass::kOk) {
        shm::ReleaseChunk(r->job()->pool().base(), chunk);
        // kBadConn: the connection broke and its session is resuming (a
        // pause, "Sessions"): read again once it is back, within the
        // timeout.
        if (e == hw::ErrorClass::kBusy ||
            (e == hw::ErrorClass::kBadConn && ReadAgainLater(t))) {
          blocked = true;
        } else {
          failed = ErrorOf(
              e == hw::ErrorClass::kBadConn ? hw::ErrorClass::kTimeout : e);
        }
        break;
      }
      read.state = RmaRead::State::kPosted;
      read.cookie = cookie;
      read.job = r->job();
      read.chunk = chunk;
      rma_posted_[cookie] = PostedRead{id, t.node, r->job(), chunk};
      did = true;
    }
    if (failed != PSM2_OK) {
      FailRead(id, failed);
      continue;
    }
    if (!blocked) rma_waiting_.erase(id);
    DeliverReads(id);  // those of a receiver that left
  }
  return did;
}

void Remote::OnReadDone(const hw::Event& e) {
  auto posted = rma_posted_.find(e.cookie);
  if (posted == rma_posted_.end()) return;
  const PostedRead pr = std::move(posted->second);
  rma_posted_.erase(posted);
  auto it = in_transfers_.find(pr.transfer);
  RmaRead* read = nullptr;
  if (it != in_transfers_.end()) {
    for (RmaRead& r : it->second->reads) {
      if (r.state == RmaRead::State::kPosted && r.cookie == e.cookie) {
        read = &r;
        break;
      }
    }
  }
  if (e.error != hw::ErrorClass::kOk) {
    // A read the backend ended by its deadline or its connection's end may
    // still be written by the provider.
    ReleaseReadChunk(pr.job, pr.chunk,
                     e.error == hw::ErrorClass::kTimeout ||
                         e.error == hw::ErrorClass::kConnReset);
    if (read != nullptr) RetryOrFailRead(pr.transfer, read, e.error);
    PumpReads();
    return;
  }
  if (read != nullptr) it->second->failing_since_ms = 0;
  PeerCounts& counts = counts_by_node_[pr.node];
  counts.rma_reads++;
  counts.rma_bytes += e.length;
  if (read == nullptr) {  // its transfer ended meanwhile
    ReleaseReadChunk(pr.job, pr.chunk, false);
  } else {
    read->state = RmaRead::State::kRead;
    DeliverReads(pr.transfer);
  }
  PumpReads();  // a slot and inbox space may be free now
}

void Remote::RetryOrFailRead(uint64_t id, RmaRead* read, hw::ErrorClass e) {
  InTransfer& t = *in_transfers_.at(id);
  // Ended with its peer (FI_ECANCELED): over RDM no proof the peer died
  // (ofi_rxm reconnects quietly, and a forged key ends so too over it).
  // As for a streamed chunk, the connection's liveness judges the peer:
  // the read goes again every kReadRetryMs; if it has not worked within
  // the fabric timeout, or the connection ends first (FailPeer), the
  // receive fails as a streamed one does then.
  if (e == hw::ErrorClass::kConnReset) {
    if (ReadAgainLater(t)) {
      read->state = RmaRead::State::kWaiting;
      read->job.reset();
      read->chunk = 0;
      rma_waiting_.insert(id);
      return;
    }
    e = hw::ErrorClass::kTimeout;
  }
  FailRead(id, ErrorOf(e));
}

bool Remote::ReadAgainLater(InTransfer& t) {
  const uint64_t now = NowMs();
  if (t.failing_since_ms == 0) t.failing_since_ms = now;
  if (now - t.failing_since_ms >= timeout_ms_) return false;
  t.retry_at_ms = now + kReadRetryMs;
  return true;
}

void Remote::DeliverReads(uint64_t id) {
  for (;;) {
    auto it = in_transfers_.find(id);
    if (it == in_transfers_.end()) return;
    InTransfer& t = *it->second;
    if (t.reads.empty() || t.reads.front().state != RmaRead::State::kRead) {
      return;
    }
    RmaRead read = std::move(t.reads.front());
    t.reads.pop_front();
    if (read.last_of_piece) {
      TellPieceDone(t, read.piece, read.len,
                    read.job ? PSM2_OK : PSM2_EPID_UNREACHABLE);
    }
    OnChunk(id, read.job, read.chunk, read.len);  // may end the transfer
  }
}

void Remote::TellPieceDone(const InTransfer& t, uint64_t piece, uint32_t len,
                           int32_t error) {
  if (Peer* p = PeerOf(t.node)) {
    Post(*p, wire::PrepRndvReadDone(t.to, t.src, piece, len, error));
  }
}

void Remote::FailRead(uint64_t id, int32_t error) {
  auto it = in_transfers_.find(id);
  if (it == in_transfers_.end()) return;
  InTransfer& t = *it->second;
  if (t.receiver != 0) {
    if (Endpoint* r = engine_->FindAny(t.receiver)) {
      engine_->PostErrorFor(*r, t.recv_req, error);
    }
  }
  // As when its receiver leaves: the sender fails the send and drops the
  // rest of its chunks.
  if (Peer* p = PeerOf(t.node)) {
    Post(*p, wire::PrepError(t.to, t.src, t.sender_req, error));
  }
  EndReads(t, error, /*tell=*/true);
  in_transfers_.erase(it);
  rma_waiting_.erase(id);
}

void Remote::EndReads(InTransfer& t, int32_t error, bool tell) {
  for (RmaRead& read : t.reads) {
    if (read.state == RmaRead::State::kRead && read.job) {
      shm::ReleaseChunk(read.job->pool().base(), read.chunk);
    }
    // (A posted read's chunk is released by its kReadDone.)
    if (tell && read.last_of_piece) TellPieceDone(t, read.piece, 0, error);
  }
  t.reads.clear();
}

void Remote::ReleaseReadChunk(const std::shared_ptr<Job>& job, uint64_t chunk,
                              bool provider_may_write) {
  auto reg = registrations_.find(job.get());
  if (provider_may_write && reg != registrations_.end()) {
    reg->second->quarantine.push_back(chunk);
    return;
  }
  shm::ReleaseChunk(job->pool().base(), chunk);
}

}  // namespace psmd
