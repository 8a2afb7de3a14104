#include "daemon/remote/remote.h"

#include <psm2.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include <spdlog/spdlog.h>

#include "daemon/engine/mq_engine.h"
#include "daemon/log.h"
#include "shm/epid.h"
#include "shm/payload.h"
#include "shm/prefault.h"

namespace psmd {

namespace {

constexpr uint32_t kEnvelopeMax = sizeof(Remote::Wire) + shm::kInlineMax;
// Frames queued to one node beyond which its senders are held.
constexpr size_t kMaxQueued = 1024;
// Receiving a payload nobody will take (its receiver is gone).
constexpr uint32_t kDiscardBytes = 64 * 1024;
// Bytes parked per connection (remote.h, back-pressure 4). What parks is
// what was in flight when kXoff reached the sender: its socket buffer (4 MiB
// at most by Linux's default tcp_wmem) and the frames it had queued.
constexpr uint64_t kParkMax = 16 << 20;

uint64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int ErrorOf(hw::ErrorClass e) {
  return e == hw::ErrorClass::kTimeout ? PSM2_TIMEOUT : PSM2_EPID_UNREACHABLE;
}

}  // namespace

// ---- state ----

struct Remote::OutFrame {
  hw::FrameFields f;
  Wire wire{};
  uint8_t inline_data[shm::kInlineMax] = {};
  iovec iov[2] = {};
  int iovcnt = 0;
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
  uint16_t op = 0;
  hw::FrameFields f;
  Wire wire{};
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
  hw::FrameFields f;
  bool chunk = false;            // a kRndvData chunk; else an envelope
  std::vector<uint8_t> env;      // the envelope as received
  std::vector<uint8_t> payload;  // its payload frame, or the chunk's bytes
  uint64_t bytes = 0;            // counted in Peer::parked_bytes
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
  uint8_t env[kEnvelopeMax] = {};
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
  std::deque<hw::FrameFields> gone_after;
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
  // Its endpoints that take eager MQ messages as envelopes only
  // (kEagerOff): such a send goes as a rendezvous (Converted).
  std::set<uint64_t> eager_off;
  bool defer_payload = false;  // the next kPayload's envelope was set aside
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
  hw::FrameFields about;  // uid and job, for an abort
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
};

bool ParseNodeTable(const std::string& text, std::map<uint16_t, NodeEntry>* out,
                    std::string* error) {
  std::istringstream in(text);
  std::string line;
  int n = 0;
  out->clear();
  while (std::getline(in, line)) {
    n++;
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string node, host, desc, extra;
    if (!(words >> node)) continue;
    if (!(words >> host >> desc) || (words >> extra)) {
      *error = "line " + std::to_string(n) +
               ": expected NODE HOSTNAME NODE@ADDR:PORT,...";
      return false;
    }
    char* end = nullptr;
    unsigned long id = strtoul(node.c_str(), &end, 10);
    hw::HostDescription parsed;
    std::string why;
    if (*end != '\0' || id == 0 || id > 0xffff) {
      *error = "line " + std::to_string(n) + ": node id 1 to 65535 expected";
      return false;
    }
    if (!hw::ParseHostDescription(desc, &parsed, &why) || parsed.node != id) {
      *error = "line " + std::to_string(n) + ": bad host description (" +
               (why.empty() ? "its node id differs" : why) + ")";
      return false;
    }
    (*out)[static_cast<uint16_t>(id)] = NodeEntry{host, desc};
  }
  return true;
}

Remote::Remote(MqEngine* engine, std::unique_ptr<hw::Fabric> fabric,
               uint16_t node_id, uint16_t boot_nonce, std::string nodes_file,
               uint32_t timeout_ms)
    : engine_(engine),
      fabric_(std::move(fabric)),
      node_id_(node_id),
      boot_nonce_(boot_nonce),
      nodes_file_(std::move(nodes_file)),
      timeout_ms_(timeout_ms) {
  ReloadNodes();  // host names for what is logged before the first connect
}

Remote::~Remote() {
  // The fabric goes first (no more events), then the chunks still lent.
  fabric_.reset();
  for (auto& [cookie, f] : in_flight_) f->ReleaseChunk();
  for (auto& [id, c] : converted_) c.payload->ReleaseChunk();
  for (auto& [node, p] : peers_) {
    for (auto& f : p->queue) f->ReleaseChunk();
    for (auto& [dst, frames] : p->deferred) {
      for (auto& f : frames) f->ReleaseChunk();
    }
  }
}

// ---- the node table ----

void Remote::ReloadNodes() {
  struct stat st;
  if (stat(nodes_file_.c_str(), &st) != 0) {
    spdlog::warn("fabric: cannot read the node table {}: {}",
                 Escaped(nodes_file_), strerror(errno));
    return;
  }
  int64_t mtime =
      int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  if (mtime == nodes_mtime_ns_) return;
  std::ifstream in(nodes_file_);
  std::stringstream text;
  text << in.rdbuf();
  std::map<uint16_t, NodeEntry> table;
  std::string error;
  if (!ParseNodeTable(text.str(), &table, &error)) {
    spdlog::warn("fabric: node table {}: {}; keeping the previous one",
                 Escaped(nodes_file_), error);
    return;
  }
  nodes_ = std::move(table);
  nodes_mtime_ns_ = mtime;
  spdlog::info("fabric: node table {}: {} nodes", Escaped(nodes_file_),
               nodes_.size());
}

// ---- sending ----

Remote::Peer* Remote::PeerOf(uint16_t node) {
  auto it = peers_.find(node);
  return it == peers_.end() ? nullptr : it->second.get();
}

Remote::Peer* Remote::PeerOfConn(hw::ConnId conn) {
  auto it = node_of_conn_.find(conn);
  if (it == node_of_conn_.end()) return nullptr;
  Peer* p = PeerOf(it->second);
  return p != nullptr && p->conn == conn ? p : nullptr;
}

void Remote::Enqueue(Peer& p, std::unique_ptr<OutFrame> f) {
  f->node = p.node;
  p.queue.push_back(std::move(f));
  Flush(p);
}

bool Remote::Defer(Peer& p, const OutFrame& f) {
  const bool off = !p.off.empty() && p.off.count(f.f.dst) != 0;
  switch (f.f.op) {
    case kPayload:
      // With its envelope, wherever that went (they are adjacent in the
      // queue, and on the wire).
      return std::exchange(p.defer_payload, false);
    case kEnvelope:
    case kAmRequest:
    case kAmReply: {
      const bool rndv = f.f.op == kEnvelope && (f.wire.flags & kWireFlagRndv);
      p.defer_payload = off && !rndv && !shm::IsInline(f.wire.len);
      return off;
    }
    case kRndvData:
      return off;
    default:
      return false;
  }
}

void Remote::Flush(Peer& p) {
  while (p.open && !p.queue.empty()) {
    if (Defer(p, *p.queue.front())) {
      const uint64_t dst = p.queue.front()->f.dst;
      p.deferred[dst].push_back(std::move(p.queue.front()));
      p.queue.pop_front();
      continue;
    }
    OutFrame& f = *p.queue.front();
    const uint64_t cookie = next_cookie_++;
    hw::ErrorClass e = fabric_->PostSend(p.conn, f.f, f.iov, f.iovcnt, cookie);
    if (e == hw::ErrorClass::kBusy) return;  // again after a kSendDone
    if (e != hw::ErrorClass::kOk) {
      // The connection is going; its kClosed fails what waits.
      f.ReleaseChunk();
      p.queue.pop_front();
      continue;
    }
    in_flight_[cookie] = std::move(p.queue.front());
    p.queue.pop_front();
    p.last_sent_ms = NowMs();
  }
}

void Remote::SendEnvelope(Peer& p, uint16_t op, const Endpoint& from,
                          uint64_t dst, uint64_t aux, const Wire& w,
                          const uint8_t* inline_data, uint32_t inline_len) {
  auto f = std::make_unique<OutFrame>();
  f->f.op = op;
  f->f.uid = from.uid();
  f->f.src = from.epid();
  f->f.dst = dst;
  std::memcpy(f->f.job, from.job()->key().uuid.data(), 16);
  f->f.aux = aux;
  f->wire = w;
  f->iov[0] = {&f->wire, sizeof(Wire)};
  f->iovcnt = 1;
  if (inline_len > 0) {
    std::memcpy(f->inline_data, inline_data, inline_len);
    f->iov[1] = {f->inline_data, inline_len};
    f->iovcnt = 2;
  }
  Enqueue(p, std::move(f));
}

void Remote::SendControl(uint16_t node, uint16_t op, uint64_t src, uint64_t dst,
                         const hw::FrameFields& about, uint64_t aux,
                         int32_t error) {
  Peer* p = PeerOf(node);
  if (p == nullptr) return;
  auto f = std::make_unique<OutFrame>();
  f->f.op = op;
  f->f.uid = about.uid;
  f->f.src = src;
  f->f.dst = dst;
  std::memcpy(f->f.job, about.job, 16);
  f->f.aux = aux;
  f->wire.error = error;
  f->iov[0] = {&f->wire, sizeof(Wire)};
  f->iovcnt = 1;
  Enqueue(*p, std::move(f));
}

std::string Remote::HostName(uint16_t node) const {
  auto entry = nodes_.find(node);
  return entry == nodes_.end() ? std::string() : entry->second.hostname;
}

std::string Remote::NodeName(uint16_t node) const {
  std::string name = "node " + std::to_string(node);
  std::string host = HostName(node);
  if (!host.empty()) name += " (" + host + ")";
  return name;
}

void Remote::Query(const Endpoint& ep, uint64_t epid, QueryDone done) {
  const uint16_t node = shm::NodeIdOf(epid);
  Peer* p = PeerOf(node);
  if (p == nullptr) {
    ReloadNodes();
    auto entry = nodes_.find(node);
    if (entry == nodes_.end()) {
      done(PSM2_EPID_UNREACHABLE, "node " + std::to_string(node) +
                                      " is not in the node table " +
                                      nodes_file_);
      return;
    }
    hw::ConnId conn = 0;
    hw::ErrorClass e = fabric_->Connect(entry->second.description, node, &conn);
    if (e != hw::ErrorClass::kOk && e != hw::ErrorClass::kAlreadyConnected) {
      done(PSM2_EPID_UNREACHABLE, "cannot connect to " + NodeName(node) + ": " +
                                      hw::ErrorClassName(e));
      return;
    }
    auto peer = std::make_unique<Peer>();
    peer->node = node;
    peer->conn = conn;
    peer->open = e == hw::ErrorClass::kAlreadyConnected;
    p = peer.get();
    peers_[node] = std::move(peer);
    node_of_conn_[conn] = node;
    if (p->open) RecvNext(*p);
  }
  const uint64_t id = next_query_++;
  queries_[id] = std::make_unique<QueryState>(
      QueryState{node, NowMs() + timeout_ms_, std::move(done)});
  Wire w{};
  SendEnvelope(*p, kQuery, ep, epid, id, w, nullptr, 0);
}

bool Remote::Send(Endpoint& sender, const shm::SubmissionDesc& d,
                  const PeerLink& to, bool may_hold) {
  const uint64_t dst = to.epid;
  const bool rndv = d.op == shm::SubmitOp::kRndvSend;
  shm::PoolPayload payload =
      rndv ? shm::PoolPayload()
           : shm::PayloadOf(sender.job()->pool().base(), d);
  Peer* p = PeerOf(shm::NodeIdOf(dst));
  if (p == nullptr || to.gone) {
    engine_->PostError(sender, d.req, PSM2_EPID_UNREACHABLE);
    return true;  // payload released
  }
  // (A closing sender's last sends are taken regardless: it saw them
  // complete, and its ring is not read again.)
  if ((p->queue.size() >= kMaxQueued || p->off.count(dst) != 0) && may_hold) {
    payload.Take();  // still the sender's: the send is held, not dropped
    return false;
  }
  Wire w{};
  std::memcpy(w.tag, d.tag, sizeof(w.tag));
  w.len = d.len;
  w.flags = d.flags | (rndv ? kWireFlagRndv : 0);
  const bool inl = !rndv && shm::IsInline(d.len);
  std::unique_ptr<OutFrame> frame;
  uint64_t aux = d.req;
  if (!rndv && !inl) {
    frame = PayloadFrame(sender, dst, d.req, &payload, d.len);
    if (p->eager_off.count(dst) != 0) {
      aux = Convert(*p, sender.id(), d.req, &w, std::move(frame));
    }
  }
  SendEnvelope(*p, kEnvelope, sender, dst, aux, w,
               inl ? d.body.inline_data : nullptr, inl ? d.len : 0);
  if (frame) Enqueue(*p, std::move(frame));
  if (rndv || (d.flags & shm::kSendSync))
    p->awaiting.insert({sender.id(), d.req});
  sender.counters.msgs_sent.Add(1);
  sender.counters.bytes_sent.Add(d.len);
  if (rndv) {
    sender.counters.rndv_msgs_sent.Add(1);
    sender.counters.rndv_bytes_sent.Add(d.len);
  }
  return true;
}

bool Remote::AmRequest(Endpoint& sender, const shm::SubmissionDesc& d,
                       const PeerLink& to, bool may_hold) {
  const uint64_t dst = to.epid;
  shm::PoolPayload payload = shm::PayloadOf(sender.job()->pool().base(), d);
  Peer* p = PeerOf(shm::NodeIdOf(dst));
  if (p == nullptr || to.gone) {
    engine_->PostError(sender, d.req, PSM2_EPID_UNREACHABLE);
    return true;
  }
  if ((p->queue.size() >= kMaxQueued || p->off.count(dst) != 0) && may_hold) {
    payload.Take();
    return false;
  }
  uint32_t flags = 0;
  if (d.flags & shm::kAmNoReply) flags |= shm::kAmRequestNoReply;
  if (d.flags & shm::kAmWantsAck) flags |= shm::kAmRequestWantsAck;
  SendAm(*p, kAmRequest, sender, dst, d, &payload, flags);
  sender.counters.am_requests_sent.Add(1);
  return true;
}

void Remote::AmReplyOrAck(Endpoint& sender, const shm::SubmissionDesc& d) {
  shm::PoolPayload payload = shm::PayloadOf(sender.job()->pool().base(), d);
  auto proxy = epid_by_proxy_.find(d.peer);
  const uint64_t dst = proxy == epid_by_proxy_.end() ? 0 : proxy->second;
  Peer* p = dst == 0 ? nullptr : PeerOf(shm::NodeIdOf(dst));
  if (d.op == shm::SubmitOp::kAmAck) {
    if (p == nullptr) return;  // the requester's node is gone
    Wire w{};
    w.tag[0] = d.body.ack.handler;
    w.error = d.body.ack.error;
    SendEnvelope(*p, kAmAck, sender, dst, d.body.ack.request, w, nullptr, 0);
    return;
  }
  if (p == nullptr) {
    engine_->PostError(sender, d.req, PSM2_EPID_UNREACHABLE);
    return;
  }
  SendAm(*p, kAmReply, sender, dst, d, &payload,
         (d.flags & shm::kAmWantsAck) ? shm::kAmRequestWantsAck : 0);
  sender.counters.am_replies_sent.Add(1);
}

void Remote::SendAm(Peer& p, uint16_t op, const Endpoint& sender, uint64_t dst,
                    const shm::SubmissionDesc& d, shm::PoolPayload* payload,
                    uint32_t wire_flags) {
  Wire w{};
  w.tag[0] = d.tag[0];
  w.tag[1] = d.tag[1];
  w.len = d.len;
  w.flags = wire_flags;
  const bool inl = shm::IsInline(d.len);
  SendEnvelope(p, op, sender, dst, d.req, w, inl ? d.body.inline_data : nullptr,
               inl ? d.len : 0);
  if (!inl) Enqueue(p, PayloadFrame(sender, dst, d.req, payload, d.len));
  if (d.flags & shm::kAmWantsAck) p.awaiting.insert({sender.id(), d.req});
}

std::unique_ptr<Remote::OutFrame> Remote::PayloadFrame(
    const Endpoint& sender, uint64_t dst, uint64_t req,
    shm::PoolPayload* payload, uint32_t len) {
  auto f = std::make_unique<OutFrame>();
  f->f.op = kPayload;
  f->f.uid = sender.uid();
  f->f.src = sender.epid();
  f->f.dst = dst;
  std::memcpy(f->f.job, sender.job()->key().uuid.data(), 16);
  f->f.aux = req;
  f->chunk_base = sender.job()->pool().base();
  f->chunk_offset = payload->Take();
  f->chunk_job = sender.job();
  PagesOf(sender.job()).pages.Prepare(f->chunk_offset, len);
  f->iov[0] = {f->chunk_base + f->chunk_offset, len};
  f->iovcnt = 1;
  return f;
}

uint64_t Remote::Convert(Peer& p, uint32_t sender, uint64_t req, Wire* w,
                         std::unique_ptr<OutFrame> payload) {
  const uint64_t id = kConvertedBit | next_converted_++;
  w->flags |= kWireFlagRndv;
  Converted& c = converted_[id];
  c.node = p.node;
  c.sender = sender;
  c.req = req;
  c.sync = (w->flags & shm::kSendSync) != 0;
  c.payload = std::move(payload);
  return id;
}

void Remote::ConvertQueued(Peer& p,
                           std::deque<std::unique_ptr<OutFrame>>& queue,
                           uint64_t dst) {
  // An eager envelope's payload frame is right behind it; a payload at the
  // front whose envelope is already on the wire stays.
  std::deque<std::unique_ptr<OutFrame>> out;
  for (size_t i = 0; i < queue.size(); i++) {
    OutFrame& env = *queue[i];
    if (env.f.op == kEnvelope && env.f.dst == dst && i + 1 < queue.size() &&
        queue[i + 1]->f.op == kPayload) {
      env.f.aux = Convert(p, shm::EndpointIdOf(env.f.src), env.f.aux, &env.wire,
                          std::move(queue[i + 1]));
      out.push_back(std::move(queue[i]));
      i++;
      continue;
    }
    out.push_back(std::move(queue[i]));
  }
  queue.swap(out);
}

void Remote::DropConverted(const std::function<bool(const Converted&)>& drop) {
  for (auto it = converted_.begin(); it != converted_.end();) {
    if (!drop(it->second)) {
      ++it;
      continue;
    }
    it->second.payload->ReleaseChunk();
    it = converted_.erase(it);
  }
}

void Remote::OnConverted(Peer& p, uint16_t op, Endpoint& t, const Wire& w) {
  const hw::FrameFields& f = p.f;
  auto it = converted_.find(f.aux);
  if (it == converted_.end() || it->second.node != p.node ||
      it->second.sender != t.id()) {
    // Not ours (a client's token never has the bit): a receiver waiting
    // for data learns there is none.
    if (op == kRndvGo && w.len > 0) {
      SendControl(p.node, kAbort, f.dst, f.src, f, w.x, PSM2_EPID_UNREACHABLE);
    }
    return;
  }
  Converted c = std::move(it->second);
  converted_.erase(it);
  std::unique_ptr<OutFrame> frame = std::move(c.payload);
  const uint32_t len = static_cast<uint32_t>(frame->iov[0].iov_len);
  if (op == kRndvGo && w.len > 0 && w.len <= len) {
    // The payload goes as the transfer's one chunk, from the same pool
    // chunk the eager send placed it in.
    frame->f.op = kRndvData;
    frame->f.aux = w.x;
    frame->f.offset = 0;
    frame->iov[0].iov_len = w.len;
    Enqueue(p, std::move(frame));
  } else {
    if (op == kRndvGo && w.len > len) {
      SendControl(p.node, kAbort, f.dst, f.src, f, w.x, PSM2_EPID_UNREACHABLE);
    }
    frame->ReleaseChunk();
  }
  if (!c.sync) return;  // its sender saw it complete when it was sent
  p.awaiting.erase({t.id(), c.req});
  if (op == kError) {
    engine_->PostError(t, c.req, w.error);
    return;
  }
  shm::CompletionDesc done{};
  done.op = shm::CompleteOp::kSendDone;
  done.req = c.req;
  done.error = PSM2_OK;
  engine_->Post(t, done);
}

bool Remote::RndvData(Endpoint& sender, const shm::SubmissionDesc& d) {
  auto it = out_transfers_.find(d.body.rndv.transfer);
  if (it == out_transfers_.end()) return false;
  OutTransfer& t = *it->second;
  if (t.sender != sender.id() || d.body.rndv.offset != t.forwarded ||
      d.len > t.send_bytes - t.forwarded) {
    return false;  // reported by the engine as a bad chunk
  }
  shm::PoolPayload chunk = shm::PayloadOf(sender.job()->pool().base(), d);
  t.forwarded += d.len;
  Peer* p = t.dead ? nullptr : PeerOf(t.node);
  if (p != nullptr) {
    auto f = std::make_unique<OutFrame>();
    f->f.op = kRndvData;
    f->f.uid = sender.uid();
    f->f.src = sender.epid();
    f->f.dst = t.dst;
    std::memcpy(f->f.job, sender.job()->key().uuid.data(), 16);
    f->f.aux = t.remote_transfer;
    f->f.offset = d.body.rndv.offset;
    f->chunk_base = sender.job()->pool().base();
    f->chunk_offset = chunk.Take();
    f->chunk_job = sender.job();
    PagesOf(sender.job()).pages.Prepare(f->chunk_offset, d.len);
    f->iov[0] = {f->chunk_base + f->chunk_offset, d.len};
    f->iovcnt = 1;
    Enqueue(*p, std::move(f));
  }
  if (t.forwarded == t.send_bytes) out_transfers_.erase(it);
  return true;
}

void Remote::CompleteSync(const Endpoint& receiver, const UnexpectedMsg& m,
                          int32_t error) {
  if (m.sender_id != 0) {  // a kept payload: its sender is waiting only
    TakeKept(m, nullptr);  // if it sent a sync message
    if (!(m.flags & shm::kSendSync)) return;
  }
  TellSender(receiver, m, error);
}

void Remote::TellSender(const Endpoint& receiver, const UnexpectedMsg& m,
                        int32_t error) {
  hw::FrameFields about;
  about.uid = receiver.uid();
  std::memcpy(about.job, receiver.job()->key().uuid.data(), 16);
  SendControl(shm::NodeIdOf(m.remote_src), error == PSM2_OK ? kSyncAck : kError,
              receiver.epid(), m.remote_src, about, m.sender_req, error);
}

void Remote::StartTransfer(Endpoint& receiver, uint64_t recv_req,
                           uint32_t send_bytes, const UnexpectedMsg& m) {
  if (m.sender_id != 0) {
    DeliverKept(receiver, recv_req, send_bytes, m);
    return;
  }
  const uint16_t node = shm::NodeIdOf(m.remote_src);
  Peer* p = PeerOf(node);
  if (p == nullptr) {
    if (send_bytes > 0) {
      engine_->PostError(receiver, recv_req, PSM2_EPID_UNREACHABLE);
    }
    return;
  }
  Wire w{};
  w.len = send_bytes;
  if (send_bytes > 0) {
    w.x = next_in_transfer_++;
    in_transfers_[w.x] = std::make_unique<InTransfer>(
        InTransfer{node, receiver.id(), recv_req, m.remote_src, send_bytes, 0,
                   m.sender_req});
  }
  SendEnvelope(*p, kRndvGo, receiver, m.remote_src, m.sender_req, w, nullptr,
               0);
}

bool Remote::TakeKept(const UnexpectedMsg& m, std::vector<uint8_t>* bytes) {
  Peer* p = PeerOf(shm::NodeIdOf(m.remote_src));
  if (p == nullptr) return false;
  auto it = p->kept.find(m.sender_id);
  if (it == p->kept.end() || it->second.f.src != m.remote_src) return false;
  Kept k = std::move(it->second);
  p->kept.erase(it);
  p->parked_bytes -= k.charged;
  if (bytes != nullptr) *bytes = std::move(k.bytes);
  if (k.waiting) {
    auto waiting = p->kept_waiting.find(k.f.dst);
    if (--waiting->second == 0) {
      p->kept_waiting.erase(waiting);
      SendControl(p->node, kEagerOn, k.f.dst, 0, k.f, 0, PSM2_OK);
    }
  }
  return true;
}

void Remote::DeliverKept(Endpoint& receiver, uint64_t recv_req,
                         uint32_t send_bytes, const UnexpectedMsg& m) {
  std::vector<uint8_t> bytes;
  if (!TakeKept(m, &bytes)) {  // gone with its connection
    if (send_bytes > 0) {
      engine_->PostError(receiver, recv_req, PSM2_EPID_UNREACHABLE);
    }
    return;
  }
  if (m.flags & shm::kSendSync) TellSender(receiver, m, PSM2_OK);
  if (send_bytes == 0) return;
  Peer& p = *PeerOf(shm::NodeIdOf(m.remote_src));
  const uint64_t id = next_in_transfer_++;
  in_transfers_[id] = std::make_unique<InTransfer>(
      InTransfer{p.node, receiver.id(), recv_req, m.remote_src, send_bytes, 0,
                 m.sender_req, send_bytes});
  bytes.resize(send_bytes);
  p.parked_bytes += bytes.size();
  p.kept_chunks.emplace_back(id, std::move(bytes));
  DeliverKeptChunks(p);
}

bool Remote::DeliverKeptChunks(Peer& p) {
  bool did = false;
  while (!p.kept_chunks.empty() && DeliverChunk(p.kept_chunks.front().first,
                                                p.kept_chunks.front().second)) {
    p.parked_bytes -= p.kept_chunks.front().second.size();
    p.kept_chunks.pop_front();
    did = true;
  }
  return did;
}

void Remote::EndpointRemoved(uint32_t id) {
  for (auto& [tid, t] : in_transfers_) {
    if (t->receiver != id) continue;
    // Its chunks still come (and are dropped); the sender learns at once,
    // unless nothing more comes (all read, or a payload kept here).
    t->receiver = 0;
    if (t->accepted == t->send_bytes) continue;
    hw::FrameFields about;
    if (Endpoint* r = engine_->FindEndpoint(id)) {
      about.uid = r->uid();
      std::memcpy(about.job, r->job()->key().uuid.data(), 16);
      SendControl(t->node, kError, r->epid(), t->src, about, t->sender_req,
                  PSM2_EPID_UNREACHABLE);
    }
  }
  for (auto it = out_transfers_.begin(); it != out_transfers_.end();) {
    OutTransfer& t = *it->second;
    if (t.sender != id) {
      ++it;
      continue;
    }
    // The receiver would wait for the rest of the message.
    if (!t.dead) {
      SendControl(t.node, kAbort, t.about.src, t.dst, t.about,
                  t.remote_transfer, PSM2_EPID_UNREACHABLE);
    }
    it = out_transfers_.erase(it);
  }
  // Their kRndvGo finds no sender.
  DropConverted([id](const Converted& c) { return c.sender == id; });
  // Nodes that connected to it learn it is gone, after everything it sent
  // (one connection per node pair keeps the order).
  if (auto w = watchers_.find(id); w != watchers_.end()) {
    if (Endpoint* ep = engine_->FindEndpoint(id)) {
      hw::FrameFields about;
      about.uid = ep->uid();
      std::memcpy(about.job, ep->job()->key().uuid.data(), 16);
      for (uint16_t node : w->second) {
        SendControl(node, kGone, ep->epid(), 0, about, 0,
                    PSM2_EPID_UNREACHABLE);
      }
    }
    watchers_.erase(w);
  }
  for (auto& [node, p] : peers_) {
    for (auto a = p->awaiting.begin(); a != p->awaiting.end();) {
      a = a->first == id ? p->awaiting.erase(a) : std::next(a);
    }
    if (p->expect_payload && p->pending.receiver == id) {
      p->pending.receiver = 0;  // its inbox chunk is released on arrival
    }
  }
}

// ---- receiving ----

Endpoint* Remote::Target(const hw::FrameFields& f) {
  if (shm::NodeIdOf(f.dst) != node_id_ ||
      shm::BootNonceOf(f.dst) != boot_nonce_) {
    return nullptr;
  }
  Endpoint* ep = engine_->FindEndpoint(shm::EndpointIdOf(f.dst));
  if (ep == nullptr || !MqEngine::Served(*ep) || ep->epid() != f.dst ||
      ep->uid() != f.uid ||
      std::memcmp(ep->job()->key().uuid.data(), f.job, 16) != 0) {
    return nullptr;
  }
  return ep;
}

std::vector<Remote::PeerRow> Remote::Stats() const {
  std::vector<PeerRow> rows;
  for (const hw::PeerStats& p : fabric_->Stats()) {
    PeerRow row;
    row.fabric = p;
    if (p.node <= 0xffff) {
      auto counts = counts_by_node_.find(static_cast<uint16_t>(p.node));
      if (counts != counts_by_node_.end()) row.counts = counts->second;
    }
    rows.push_back(row);
  }
  return rows;
}

void Remote::Refused(uint16_t node, const hw::FrameFields& f,
                     const char* what) {
  refused_++;
  counts_by_node_[node].refused++;
  WarnClient(f.uid,
             "fabric: {} from epid {:#x} (node {}) for epid {:#x}: no such "
             "endpoint of that job and uid here ({} refused so far)",
             what, f.src, shm::NodeIdOf(f.src), f.dst, refused_);
}

Remote::JobPages& Remote::PagesOf(const std::shared_ptr<Job>& job) {
  auto& slot = job_pages_[job.get()];
  if (slot && slot->job.lock() == job) return *slot;
  // A new job (or a new one at a gone job's address): the moment to forget
  // the jobs that are gone, so the map holds live jobs only.
  for (auto it = job_pages_.begin(); it != job_pages_.end();) {
    it = it->second && it->second->job.expired() ? job_pages_.erase(it)
                                                 : std::next(it);
  }
  auto& fresh = job_pages_[job.get()];
  fresh = std::make_unique<JobPages>();
  fresh->job = job;
  fresh->pages = shm::Prefaulter(job->pool().base(), job->pool().size());
  if (auto region = job->InboxRegion()) {
    fresh->inbox.emplace(job->pool().base(), region->offset, region->bytes);
  }
  return *fresh;
}

bool Remote::AllocInbox(Endpoint& ep, uint32_t bytes, uint64_t* offset,
                        shm::ChunkUse use) {
  JobPages& job = PagesOf(ep.job());
  if (!job.inbox || bytes > job.inbox->MaxPayload()) return false;
  auto got = job.inbox->Allocate(bytes, use);
  if (!got) return false;
  job.pages.Prepare(*got - shm::kChunkHeaderBytes,
                    uint64_t{bytes} + shm::kChunkHeaderBytes);
  *offset = *got;
  return true;
}

uint32_t Remote::ProxyFor(uint64_t epid) {
  auto [it, fresh] = proxy_by_epid_.try_emplace(epid, 0);
  if (!fresh) return it->second;
  // Live proxies are bounded by the endpoints of connected nodes, far
  // fewer than the 2^31 ids, so this finds a free one quickly.
  do {
    it->second = next_proxy_;
    next_proxy_ = next_proxy_ + 1 == kRemotePeer ? kProxyBase : next_proxy_ + 1;
  } while (epid_by_proxy_.count(it->second) != 0);
  epid_by_proxy_[it->second] = epid;
  return it->second;
}

void Remote::DropProxy(uint64_t epid) {
  auto it = proxy_by_epid_.find(epid);
  if (it == proxy_by_epid_.end()) return;
  epid_by_proxy_.erase(it->second);
  proxy_by_epid_.erase(it);
}

void Remote::RecvNext(Peer& p) {
  if (p.dropped) return;
  p.rx = Peer::Rx::kHeader;
  if (fabric_->PostRecvHeader(p.conn, p.node) != hw::ErrorClass::kOk) {
    p.rx = Peer::Rx::kIdle;  // the connection is going; kClosed follows
  }
}

void Remote::Drop(Peer& p, const char* why) {
  if (!p.bad_logged) {
    spdlog::warn(
        "fabric: node {} sent a frame the engine refuses ({}); dropping the "
        "connection",
        p.node, why);
    p.bad_logged = true;
  }
  p.rx = Peer::Rx::kIdle;
  p.dropped = true;
  fabric_->Close(p.conn);
}

void Remote::OnHeader(Peer& p, const hw::Event& e) {
  p.last_recv_ms = NowMs();
  p.f = e.fields;
  p.length = e.length;
  const uint16_t op = e.fields.op;
  if (op == kPayload) {
    if (!p.expect_payload || e.length != p.pending.wire.len ||
        e.fields.aux != p.pending.f.aux || e.fields.dst != p.pending.f.dst) {
      Drop(p, "payload without its envelope");
      return;
    }
    iovec iov;
    if (p.park_payload) {
      std::vector<uint8_t>& to = p.parked[p.pending.f.dst].back().payload;
      to.resize(e.length);
      iov = {to.data(), e.length};
    } else if (p.pending.keep) {
      p.pending.kept.resize(e.length);
      iov = {p.pending.kept.data(), e.length};
    } else if (p.pending.receiver != 0) {
      iov = {p.pending.job->pool().base() + p.pending.chunk, e.length};
    } else {
      p.discard.resize(std::min<uint32_t>(e.length, kDiscardBytes));
      iov = {p.discard.data(), p.discard.size()};
    }
    p.rx = Peer::Rx::kPayload;
    fabric_->PostPayload(p.conn, &iov, 1, p.node);
    return;
  }
  if (p.expect_payload) {
    Drop(p, "envelope without its payload");
    return;
  }
  if (op == kRndvData) {
    auto it = in_transfers_.find(e.fields.aux);
    if (it == in_transfers_.end() || it->second->node != p.node ||
        it->second->src != e.fields.src ||
        e.fields.offset != it->second->accepted || e.length == 0 ||
        e.length > it->second->send_bytes - it->second->accepted) {
      Drop(p, "rendezvous chunk of no transfer, or out of order");
      return;
    }
    InTransfer& t = *it->second;
    p.chunk_transfer = e.fields.aux;
    p.chunk_offset = 0;
    p.chunk_job.reset();
    p.park_chunk = false;
    Endpoint* r = t.receiver == 0 ? nullptr : engine_->FindEndpoint(t.receiver);
    if (r != nullptr) {
      // Behind what is parked for its receiver, or parked itself when the
      // inbox is full.
      if (p.parked.count(e.fields.dst) != 0 ||
          !AllocInbox(*r, e.length, &p.chunk_offset)) {
        if (!Park(p, /*chunk=*/true)) {
          p.rx = Peer::Rx::kPaused;  // retried in Poll
          return;
        }
      } else {
        p.chunk_job = r->job();
      }
    }
    t.accepted += e.length;
    iovec iov;
    if (p.park_chunk) {
      std::vector<uint8_t>& to = p.parked[e.fields.dst].back().payload;
      to.resize(e.length);
      iov = {to.data(), e.length};
    } else if (p.chunk_job) {
      iov = {p.chunk_job->pool().base() + p.chunk_offset, e.length};
    } else {
      p.discard.resize(std::min<uint32_t>(e.length, kDiscardBytes));
      iov = {p.discard.data(), p.discard.size()};
    }
    p.rx = Peer::Rx::kChunk;
    fabric_->PostPayload(p.conn, &iov, 1, p.node);
    return;
  }
  if (op < kQuery || op > kLastOp || e.length < sizeof(Wire) ||
      e.length > kEnvelopeMax) {
    Drop(p, "unknown op or envelope size");
    return;
  }
  iovec iov{p.env, e.length};
  p.rx = Peer::Rx::kEnvelope;
  fabric_->PostPayload(p.conn, &iov, 1, p.node);
}

void Remote::OnRecvDone(Peer& p, const hw::Event& e) {
  // A discarded payload longer than the scratch buffer ends kTruncated.
  if (e.error != hw::ErrorClass::kOk && e.error != hw::ErrorClass::kTruncated)
    return;  // kClosed follows
  switch (p.rx) {
    case Peer::Rx::kEnvelope:
      if (Admit(p) == Verdict::kPause && !Park(p, /*chunk=*/false)) {
        p.rx = Peer::Rx::kPaused;
        return;
      }
      break;
    case Peer::Rx::kPayload:
      if (p.park_payload) {
        p.park_payload = false;
        p.expect_payload = false;
        p.pending = Pending{};
      } else {
        OnPayload(p);
      }
      break;
    case Peer::Rx::kChunk:
      if (p.park_chunk) {
        p.park_chunk = false;
      } else {
        OnChunk(p.chunk_transfer, p.chunk_job, p.chunk_offset, p.length);
        p.chunk_job.reset();
      }
      break;
    default:
      Drop(p, "receive completion out of turn");
      return;
  }
  RecvNext(p);
}

void Remote::OnPayload(Peer& p) {
  Pending& q = p.pending;
  p.expect_payload = false;
  Endpoint* r = q.receiver == 0 ? nullptr : engine_->FindEndpoint(q.receiver);
  if (r == nullptr || r->job() != q.job) {
    if (q.job && !q.keep) shm::ReleaseChunk(q.job->pool().base(), q.chunk);
    if (q.op == kEnvelope && (q.wire.flags & shm::kSendSync) &&
        q.receiver != 0) {
      SendControl(p.node, kError, q.f.dst, q.f.src, q.f, q.f.aux,
                  PSM2_EPID_UNREACHABLE);
    }
  } else if (q.op == kEnvelope) {
    UnexpectedMsg m{};
    m.flags = static_cast<uint8_t>(q.wire.flags);
    m.len = q.wire.len;
    m.sender_req = q.f.aux;
    m.pool_offset = q.chunk;
    m.remote_src = q.f.src;
    Kept* kept = nullptr;
    if (q.keep) {  // a rendezvous from this daemon's memory
      m.rendezvous = true;
      m.pool_offset = 0;
      m.sender_id = p.NextKeptId(&next_kept_);
      kept = &p.kept[m.sender_id];
      kept->f = q.f;
      kept->bytes = std::move(q.kept);
      kept->charged = sizeof(Kept) + kept->bytes.size();
      p.parked_bytes += kept->charged;
      counts_by_node_[p.node].kept++;
    }
    const MqEngine::Arrival arrival = engine_->Arrive(
        *r, KeyOf(q.f.src, q.wire.tag), m, MqEngine::Part::kPayload,
        q.matched ? &q.recv : nullptr);
    if (arrival == MqEngine::Arrival::kQueued && kept != nullptr) {
      kept->waiting = true;
      if (p.kept_waiting[q.f.dst]++ == 0) {  // (takes uid and job of q.f)
        SendControl(p.node, kEagerOff, q.f.dst, 0, q.f, 0, PSM2_OK);
      }
    }
  } else {  // kAmRequest, kAmReply
    shm::CompletionDesc c{};
    c.op = q.op == kAmRequest ? shm::CompleteOp::kAmRequest
                              : shm::CompleteOp::kAmReply;
    c.flags = static_cast<uint8_t>(q.wire.flags);
    c.req = q.f.aux;
    c.tag[0] = q.wire.tag[0];
    c.tag[1] = q.wire.tag[1];
    c.tag[2] = ProxyFor(q.f.src);
    c.msg_len = q.wire.len;
    c.src_epid = q.f.src;
    c.body.pool.pool_offset = q.chunk;
    engine_->Post(*r, c);
  }
  q = Pending{};
}

void Remote::OnChunk(uint64_t transfer_id, const std::shared_ptr<Job>& job,
                     uint64_t chunk, uint32_t len) {
  auto it = in_transfers_.find(transfer_id);
  if (it == in_transfers_.end()) {
    if (job) shm::ReleaseChunk(job->pool().base(), chunk);
    return;
  }
  InTransfer& t = *it->second;
  Endpoint* r = t.receiver == 0 ? nullptr : engine_->FindEndpoint(t.receiver);
  if (job && (r == nullptr || r->job() != job)) {
    shm::ReleaseChunk(job->pool().base(), chunk);
  } else if (job) {
    shm::CompletionDesc c{};
    c.op = shm::CompleteOp::kRndvChunk;
    c.req = t.recv_req;
    c.body.chunk.pool_offset = chunk;
    c.body.chunk.offset = t.received;
    c.body.chunk.len = len;
    engine_->Post(*r, c);
  }
  t.received += len;
  if (t.received == t.send_bytes) in_transfers_.erase(it);
}

Remote::Verdict Remote::Admit(Peer& p) {
  switch (p.f.op) {
    case kEnvelope:
    case kAmRequest:
    case kAmReply:
      if (p.parked.count(p.f.dst) != 0) return Verdict::kPause;
      break;
    case kGone:
      if (p.parked_from.count(p.f.src) != 0) return Verdict::kPause;
      break;
    default:
      break;
  }
  return OnEnvelope(p);
}

bool Remote::Park(Peer& p, bool chunk) {
  const hw::FrameFields& f = p.f;
  uint64_t payload = 0;
  if (chunk) {
    payload = p.length;
  } else if (f.op != kGone) {
    Wire w;
    std::memcpy(&w, p.env, sizeof(Wire));
    const bool rndv = f.op == kEnvelope && (w.flags & kWireFlagRndv);
    if (!rndv && !shm::IsInline(w.len)) payload = w.len;
  }
  const uint64_t bytes = sizeof(Parked) + (chunk ? 0 : p.length) + payload;
  if (p.parked_bytes + bytes > kParkMax) {
    if (!p.park_full_logged) {
      spdlog::warn(
          "fabric: {} MiB parked for slow receivers from node {}; reading "
          "from it pauses until they drain (its daemon should have held "
          "them back on kXoff)",
          kParkMax >> 20, p.node);
      p.park_full_logged = true;
    }
    return false;
  }
  p.parked_bytes += bytes;
  counts_by_node_[p.node].parked++;
  if (f.op == kGone) {
    p.gone_after.push_back(f);
    return true;
  }
  auto [list, first] = p.parked.try_emplace(f.dst);
  p.parked_from[f.src]++;
  Parked& e = list->second.emplace_back();
  e.f = f;
  e.chunk = chunk;
  e.bytes = bytes;
  if (chunk) {
    p.park_chunk = true;
  } else {
    e.env.assign(p.env, p.env + p.length);
    e.has_held = std::exchange(p.has_held, false);
    e.held_receiver = p.held_receiver;
    e.held_recv = p.held_recv;
    if (payload > 0) {
      p.pending = Pending{};
      p.pending.op = f.op;
      p.pending.f = f;
      std::memcpy(&p.pending.wire, p.env, sizeof(Wire));
      p.expect_payload = true;
      p.park_payload = true;
    }
  }
  if (first) SendControl(p.node, kXoff, f.dst, 0, f, 0, PSM2_OK);
  return true;
}

bool Remote::RetryParked(Peer& p) {
  // Matched kept payloads first: nothing received before them on the
  // connection waits for them.
  const bool moved = DeliverKeptChunks(p);
  if (p.parked.empty() && p.gone_after.empty()) return moved;
  // Only between frames: a payload or chunk being read owns p.pending or
  // p.chunk_*. A paused frame's state is kept aside meanwhile.
  if (p.expect_payload || p.dropped ||
      (p.rx != Peer::Rx::kHeader && p.rx != Peer::Rx::kPaused)) {
    return moved;
  }
  const hw::FrameFields f = p.f;
  const uint32_t length = p.length;
  uint8_t env[kEnvelopeMax];
  std::memcpy(env, p.env, sizeof(env));
  const bool has_held = std::exchange(p.has_held, false);
  const uint32_t held_receiver = p.held_receiver;
  const PostedRecv held_recv = p.held_recv;
  bool did = false;
  for (auto it = p.parked.begin(); it != p.parked.end() && !p.dropped;) {
    std::deque<Parked>& frames = it->second;
    hw::FrameFields about;
    while (!frames.empty() && !p.dropped && Deliver(p, frames.front())) {
      about.uid = frames.front().f.uid;
      std::memcpy(about.job, frames.front().f.job, 16);
      p.parked_bytes -= frames.front().bytes;
      auto from = p.parked_from.find(frames.front().f.src);
      if (--from->second == 0) p.parked_from.erase(from);
      frames.pop_front();
      did = true;
    }
    if (!frames.empty()) {
      ++it;
      continue;
    }
    SendControl(p.node, kXon, it->first, 0, about, 0, PSM2_OK);
    it = p.parked.erase(it);
  }
  while (!p.gone_after.empty() && !p.dropped) {
    p.f = p.gone_after.front();
    p.length = sizeof(Wire);
    std::memset(p.env, 0, sizeof(Wire));
    if (Admit(p) == Verdict::kPause) break;
    p.gone_after.pop_front();
    p.parked_bytes -= sizeof(Parked);
    did = true;
  }
  p.f = f;
  p.length = length;
  std::memcpy(p.env, env, sizeof(env));
  p.has_held = has_held;
  p.held_receiver = held_receiver;
  p.held_recv = held_recv;
  return did || moved;
}

bool Remote::DeliverChunk(uint64_t transfer_id,
                          const std::vector<uint8_t>& bytes) {
  const uint32_t len = static_cast<uint32_t>(bytes.size());
  auto it = in_transfers_.find(transfer_id);
  Endpoint* r = it == in_transfers_.end() || it->second->receiver == 0
                    ? nullptr
                    : engine_->FindEndpoint(it->second->receiver);
  if (r == nullptr) {
    OnChunk(transfer_id, nullptr, 0, len);  // its receiver left: dropped
    return true;
  }
  uint64_t chunk = 0;
  if (!AllocInbox(*r, len, &chunk)) return false;
  std::memcpy(r->job()->pool().base() + chunk, bytes.data(), len);
  OnChunk(transfer_id, r->job(), chunk, len);
  return true;
}

bool Remote::Deliver(Peer& p, Parked& e) {
  p.f = e.f;
  if (e.chunk) return DeliverChunk(e.f.aux, e.payload);
  p.length = static_cast<uint32_t>(e.env.size());
  std::memcpy(p.env, e.env.data(), e.env.size());
  p.has_held = e.has_held;
  p.held_receiver = e.held_receiver;
  p.held_recv = e.held_recv;
  if (OnEnvelope(p) == Verdict::kPause) {
    e.has_held = std::exchange(p.has_held, false);
    e.held_receiver = p.held_receiver;
    e.held_recv = p.held_recv;
    return false;
  }
  if (p.expect_payload) {  // its payload is e.payload
    if (p.pending.keep) {
      p.pending.kept = std::move(e.payload);
    } else if (p.pending.receiver != 0 &&
               e.payload.size() == p.pending.wire.len) {
      std::memcpy(p.pending.job->pool().base() + p.pending.chunk,
                  e.payload.data(), e.payload.size());
    }
    OnPayload(p);
  }
  return true;
}

Remote::Verdict Remote::OnEnvelope(Peer& p) {
  const hw::FrameFields& f = p.f;
  Wire w;
  std::memcpy(&w, p.env, sizeof(Wire));
  const uint8_t* inline_data = p.env + sizeof(Wire);
  const uint32_t inline_len = p.length - sizeof(Wire);
  switch (f.op) {
    case kQuery: {
      Endpoint* t = Target(f);
      if (t == nullptr) Refused(p.node, f, "connect");
      if (t != nullptr) watchers_[t->id()].insert(p.node);
      SendControl(p.node, kAnswer, f.dst, f.src, f, f.aux,
                  t != nullptr ? PSM2_OK : PSM2_EPID_UNREACHABLE);
      return Verdict::kDone;
    }
    case kAnswer: {
      auto it = queries_.find(f.aux);
      if (it != queries_.end() && it->second->node == p.node) {
        QueryDone done = std::move(it->second->done);
        queries_.erase(it);
        done(w.error,
             w.error == PSM2_OK
                 ? std::string()
                 : NodeName(p.node) +
                       " has no endpoint of this job and uid with that epid");
      }
      return Verdict::kDone;
    }
    case kSyncAck:
    case kError: {
      Endpoint* t = Target(f);
      if (t == nullptr) return Verdict::kDone;  // the sender is gone
      if (f.aux & kConvertedBit) {
        OnConverted(p, f.op, *t, w);
        return Verdict::kDone;
      }
      p.awaiting.erase({t->id(), f.aux});
      if (f.op == kError) {
        // A rendezvous send streaming to a receiver that left: its chunks
        // still on the ring are dropped.
        for (auto& [id, out] : out_transfers_) {
          if (out->sender == t->id() && out->sender_req == f.aux) {
            out->dead = true;
          }
        }
      }
      if (f.op == kSyncAck) {
        shm::CompletionDesc c{};
        c.op = shm::CompleteOp::kSendDone;
        c.req = f.aux;
        c.error = w.error;
        engine_->Post(*t, c);
      } else {
        engine_->PostError(*t, f.aux, w.error);
      }
      return Verdict::kDone;
    }
    case kRndvGo: {
      Endpoint* t = Target(f);
      if (t == nullptr) {
        // The sender left: the receiver would wait for its data.
        if (w.len > 0) {
          SendControl(p.node, kAbort, f.dst, f.src, f, w.x,
                      PSM2_EPID_UNREACHABLE);
        }
        return Verdict::kDone;
      }
      if (f.aux & kConvertedBit) {
        OnConverted(p, f.op, *t, w);
        return Verdict::kDone;
      }
      p.awaiting.erase({t->id(), f.aux});
      shm::CompletionDesc go{};
      go.op = shm::CompleteOp::kRndvGo;
      go.req = f.aux;
      go.error = PSM2_OK;
      go.body.go.send_bytes = w.len;
      if (w.len > 0) {
        go.body.go.transfer = engine_->NewTransferId();
        hw::FrameFields about;
        about.uid = f.uid;
        about.src = t->epid();
        std::memcpy(about.job, f.job, 16);
        out_transfers_[go.body.go.transfer] =
            std::make_unique<OutTransfer>(OutTransfer{
                p.node, t->id(), f.src, w.x, w.len, 0, false, f.aux, about});
      }
      engine_->Post(*t, go);
      return Verdict::kDone;
    }
    case kPing:
      return Verdict::kDone;
    case kXoff:
    case kXon:
    case kEagerOff:
    case kEagerOn: {
      // Only a node's own endpoints: a node cannot switch off another's.
      if (shm::NodeIdOf(f.src) != p.node) return Verdict::kDone;
      if (f.op == kEagerOff) {
        counts_by_node_[p.node].eager_offs++;
        p.eager_off.insert(f.src);
        // Its queued eager envelopes (those set aside too) go as
        // rendezvous ones.
        ConvertQueued(p, p.queue, f.src);
        if (auto set_aside = p.deferred.find(f.src);
            set_aside != p.deferred.end()) {
          ConvertQueued(p, set_aside->second, f.src);
        }
        return Verdict::kDone;
      }
      if (f.op == kEagerOn) {
        p.eager_off.erase(f.src);
        return Verdict::kDone;
      }
      if (f.op == kXoff) {
        counts_by_node_[p.node].xoffs++;
        p.off.insert(f.src);
        return Verdict::kDone;
      }
      p.off.erase(f.src);
      auto set_aside = p.deferred.find(f.src);
      if (set_aside != p.deferred.end()) {
        // Back to the front of the queue, in their order; after a payload
        // whose envelope is already on the wire.
        auto at = p.queue.begin();
        if (at != p.queue.end() && (*at)->f.op == kPayload) ++at;
        p.queue.insert(at, std::make_move_iterator(set_aside->second.begin()),
                       std::make_move_iterator(set_aside->second.end()));
        p.deferred.erase(set_aside);
        Flush(p);
      }
      return Verdict::kDone;
    }
    case kGone: {
      // Only a node's own endpoints: a node cannot declare another's gone.
      if (shm::NodeIdOf(f.src) != p.node) return Verdict::kDone;
      DropProxy(f.src);
      engine_->PeersGone(
          [&f](const Endpoint& ep, const PeerLink& link) {
            return link.endpoint_id == kRemotePeer && link.epid == f.src &&
                   ep.uid() == f.uid &&
                   std::memcmp(ep.job()->key().uuid.data(), f.job, 16) == 0;
          },
          PSM2_EPID_UNREACHABLE);
      return Verdict::kDone;
    }
    case kAbort: {
      auto it = in_transfers_.find(f.aux);
      if (it == in_transfers_.end() || it->second->node != p.node ||
          it->second->src != f.src) {
        return Verdict::kDone;
      }
      if (it->second->receiver != 0) {
        if (Endpoint* r = engine_->FindEndpoint(it->second->receiver)) {
          engine_->PostError(*r, it->second->recv_req, w.error);
        }
      }
      in_transfers_.erase(it);
      return Verdict::kDone;
    }
    case kAmAck: {
      Endpoint* t = Target(f);
      if (t == nullptr) return Verdict::kDone;
      p.awaiting.erase({t->id(), f.aux});
      shm::CompletionDesc c{};
      c.op = shm::CompleteOp::kAmAcked;
      c.req = f.aux;
      c.error = w.error;
      c.tag[0] = w.tag[0];
      c.src_epid = f.src;
      engine_->Post(*t, c);
      return Verdict::kDone;
    }
    case kEnvelope:
    case kAmRequest:
    case kAmReply:
      break;
    default:
      return Verdict::kDone;
  }
  // A message: an MQ send or an active message.
  const bool rndv = f.op == kEnvelope && (w.flags & kWireFlagRndv);
  const bool inl = !rndv && shm::IsInline(w.len);
  if ((inl && inline_len != w.len) || (!inl && inline_len != 0)) {
    Drop(p, "envelope length");
    return Verdict::kDone;
  }
  Endpoint* r = Target(f);
  Pending q;
  q.op = f.op;
  q.f = f;
  q.wire = w;
  if (r == nullptr) {
    Refused(p.node, f, f.op == kEnvelope ? "a message" : "an active message");
    // As for a local receiver that is gone, the sender's request gets an
    // error completion (a reply's sender is not waiting for one).
    if (f.op != kAmReply) {
      SendControl(p.node, kError, f.dst, f.src, f, f.aux,
                  PSM2_EPID_UNREACHABLE);
    }
    if (!inl && !rndv) {  // its payload frame comes next; read and drop it
      p.pending = q;
      p.expect_payload = true;
    }
    return Verdict::kDone;
  }
  if (f.op != kEnvelope) {  // active message: held while the target is slow
    if (MqEngine::AmHeld(*r)) {
      return Verdict::kPause;
    }
    if (inl) {
      shm::CompletionDesc c{};
      c.op = f.op == kAmRequest ? shm::CompleteOp::kAmRequest
                                : shm::CompleteOp::kAmReply;
      c.flags = static_cast<uint8_t>(w.flags) | shm::kPayloadInline;
      c.req = f.aux;
      c.tag[0] = w.tag[0];
      c.tag[1] = w.tag[1];
      c.tag[2] = ProxyFor(f.src);
      c.msg_len = w.len;
      c.src_epid = f.src;
      std::memcpy(c.body.inline_data, inline_data, w.len);
      engine_->Post(*r, c);
      return Verdict::kDone;
    }
    if (!AllocInbox(*r, w.len, &q.chunk)) return Verdict::kPause;
    q.receiver = r->id();
    q.job = r->job();
    p.pending = q;
    p.expect_payload = true;
    return Verdict::kDone;
  }
  UnexpectedMsg m{};
  m.flags = static_cast<uint8_t>(w.flags);
  m.rendezvous = rndv;
  m.len = w.len;
  m.sender_req = f.aux;
  m.remote_src = f.src;
  if (inl) std::memcpy(m.inline_data, inline_data, w.len);
  const MsgKey key = KeyOf(f.src, w.tag);
  if (rndv || inl) {
    return engine_->Arrive(*r, key, m) == MqEngine::Arrival::kHeld
               ? Verdict::kPause
               : Verdict::kDone;
  }
  // The payload follows. A receive it matches is taken now (and kept
  // across pauses: the message is next in its flow anyway); otherwise the
  // budget must admit it. Then it needs inbox space.
  if (p.has_held && p.held_receiver != r->id()) p.has_held = false;
  if (!p.has_held) {
    switch (
        engine_->Arrive(*r, key, m, MqEngine::Part::kEnvelope, &p.held_recv)) {
      case MqEngine::Arrival::kMatched:
        p.has_held = true;
        p.held_receiver = r->id();
        break;
      case MqEngine::Arrival::kHeld:
        return Verdict::kPause;
      case MqEngine::Arrival::kQueued:
        break;
    }
  }
  // A message that may stay unexpected takes at most half the inbox; the
  // rest is for the ones receives wait for. When that has had no room for
  // a while, its payload is kept (remote.h, back-pressure 3).
  if (!AllocInbox(
          *r, w.len, &q.chunk,
          p.has_held ? shm::ChunkUse::kBrief : shm::ChunkUse::kMayLinger)) {
    const auto& inbox = PagesOf(r->job()).inbox;
    if (!inbox || !inbox->Stalled() ||
        p.parked_bytes + sizeof(Kept) + w.len > kParkMax) {
      return Verdict::kPause;
    }
    q.keep = true;
  }
  q.matched = p.has_held;
  q.recv = p.held_recv;
  p.has_held = false;
  q.receiver = r->id();
  q.job = r->job();
  p.pending = q;
  p.expect_payload = true;
  return Verdict::kDone;
}

// ---- events, failure ----

void Remote::FailPeer(uint16_t node, hw::ErrorClass why) {
  auto it = peers_.find(node);
  if (it == peers_.end()) return;
  ReloadNodes();  // the host name kNodeLost carries, as the table is now
  std::unique_ptr<Peer> p = std::move(it->second);
  peers_.erase(it);
  node_of_conn_.erase(p->conn);
  const int error = ErrorOf(why);
  spdlog::warn("fabric: connection to node {} ended ({}); {} requests fail",
               node, p->dropped ? "dropped by us" : hw::ErrorClassName(why),
               p->awaiting.size());
  for (const auto& [id, req] : p->awaiting) {
    if (Endpoint* ep = engine_->FindEndpoint(id))
      engine_->PostError(*ep, req, error);
  }
  for (auto& f : p->queue) f->ReleaseChunk();
  for (auto& [dst, frames] : p->deferred) {
    for (auto& f : frames) f->ReleaseChunk();
  }
  // (A synchronous one failed with awaiting.)
  DropConverted([node](const Converted& c) { return c.node == node; });
  if (p->expect_payload && p->pending.job) {
    shm::ReleaseChunk(p->pending.job->pool().base(), p->pending.chunk);
  }
  // Receives already matched to a message that will not arrive now.
  auto fail_recv = [&](uint32_t id, uint64_t req) {
    if (Endpoint* r = engine_->FindEndpoint(id))
      engine_->PostError(*r, req, error);
  };
  if (p->expect_payload && p->pending.matched && p->pending.receiver != 0) {
    fail_recv(p->pending.receiver, p->pending.recv.req);
  }
  if (p->has_held) fail_recv(p->held_receiver, p->held_recv.req);
  for (const auto& [dst, frames] : p->parked) {
    for (const Parked& e : frames) {
      if (e.has_held) fail_recv(e.held_receiver, e.held_recv.req);
    }
  }
  if (p->rx == Peer::Rx::kChunk && p->chunk_job) {
    shm::ReleaseChunk(p->chunk_job->pool().base(), p->chunk_offset);
  }
  for (auto t = in_transfers_.begin(); t != in_transfers_.end();) {
    if (t->second->node != node) {
      ++t;
      continue;
    }
    if (t->second->receiver != 0) {
      if (Endpoint* r = engine_->FindEndpoint(t->second->receiver)) {
        engine_->PostError(*r, t->second->recv_req, error);
      }
    }
    t = in_transfers_.erase(t);
  }
  for (auto it = proxy_by_epid_.begin(); it != proxy_by_epid_.end();) {
    if (shm::NodeIdOf(it->first) != node) {
      ++it;
      continue;
    }
    epid_by_proxy_.erase(it->second);
    it = proxy_by_epid_.erase(it);
  }
  // Nothing more comes from that node's endpoints (what they sent went
  // with the connection): receives naming them fail now (mq_engine.h
  // invariant 8); a later psm2_ep_connect to an epid there re-arms its
  // link. A receive from any source stays posted, and messages in flight
  // are lost, so each endpoint that had connected to one there is told
  // (kNodeLost: its library reports it through the error handler, which
  // for an MPI job ends it instead of leaving a rank waiting forever).
  // Per endpoint: how many of its links went, and one of their epids.
  std::unordered_map<const Endpoint*, shm::CompletionDesc> lost_at;
  engine_->PeersGone(
      [&](const Endpoint& ep, const PeerLink& link) {
        if (link.endpoint_id != kRemotePeer ||
            shm::NodeIdOf(link.epid) != node) {
          return false;
        }
        shm::CompletionDesc& lost = lost_at[&ep];
        lost.msg_len++;
        lost.src_epid = link.epid;
        return true;
      },
      error);
  for (Endpoint* ep : engine_->endpoints()) {
    auto at = lost_at.find(ep);
    if (at == lost_at.end()) continue;
    shm::CompletionDesc& lost = at->second;
    lost.op = shm::CompleteOp::kNodeLost;
    lost.error = error;
    lost.tag[0] = node;
    HostName(node).copy(reinterpret_cast<char*>(lost.body.inline_data),
                        shm::kInlineMax - 1);
    engine_->Post(*ep, lost);
  }
  for (auto& [id, t] : out_transfers_) {
    if (t->node != node || t->dead) continue;
    t->dead = true;
    // As when a local receiver leaves: the sender learns at once.
    if (Endpoint* s = engine_->FindEndpoint(t->sender)) {
      engine_->PostError(*s, t->sender_req, error);
    }
  }
  for (auto q = queries_.begin(); q != queries_.end();) {
    if (q->second->node != node) {
      ++q;
      continue;
    }
    QueryDone done = std::move(q->second->done);
    q = queries_.erase(q);
    done(error,
         NodeName(node) + " cannot be reached: " + hw::ErrorClassName(why));
  }
  engine_->NotifyClients();
}

void Remote::HandleEvent(const hw::Event& e) {
  switch (e.type) {
    case hw::EventType::kConnected: {
      Peer* p = PeerOfConn(e.conn);
      if (p == nullptr) return;
      if (e.error != hw::ErrorClass::kOk) {
        FailPeer(p->node, e.error);
        return;
      }
      p->open = true;
      p->last_sent_ms = p->last_recv_ms = NowMs();
      spdlog::info("fabric: connected to node {}", p->node);
      RecvNext(*p);
      Flush(*p);
      return;
    }
    case hw::EventType::kAccepted: {
      const uint16_t node = static_cast<uint16_t>(e.peer_node);
      if (e.peer_node > 0xffff || e.peer_node == 0) {
        fabric_->Close(e.conn);
        return;
      }
      if (Peer* old = PeerOf(node); old != nullptr && old->conn != e.conn) {
        FailPeer(node, hw::ErrorClass::kConnReset);  // the peer restarted
      }
      auto peer = std::make_unique<Peer>();
      peer->node = node;
      peer->conn = e.conn;
      peer->open = true;
      Peer* p = peer.get();
      peers_[node] = std::move(peer);
      node_of_conn_[e.conn] = node;
      spdlog::info("fabric: node {} connected", node);
      RecvNext(*p);
      return;
    }
    case hw::EventType::kSendDone: {
      auto it = in_flight_.find(e.cookie);
      if (it == in_flight_.end()) return;
      std::unique_ptr<OutFrame> f = std::move(it->second);
      in_flight_.erase(it);
      f->ReleaseChunk();
      if (Peer* p = PeerOf(f->node)) Flush(*p);
      return;
    }
    case hw::EventType::kHeader: {
      Peer* p = PeerOfConn(e.conn);
      if (p == nullptr) return;
      if (e.error != hw::ErrorClass::kOk) return;  // kClosed follows
      OnHeader(*p, e);
      return;
    }
    case hw::EventType::kRecvDone: {
      Peer* p = PeerOfConn(e.conn);
      if (p == nullptr) return;
      OnRecvDone(*p, e);
      return;
    }
    case hw::EventType::kClosed: {
      Peer* p = PeerOfConn(e.conn);
      node_of_conn_.erase(e.conn);
      if (p != nullptr) FailPeer(p->node, e.error);
      return;
    }
  }
}

void Remote::CheckDeadlines() {
  const uint64_t now = NowMs();
  for (auto q = queries_.begin(); q != queries_.end();) {
    if (q->second->deadline_ms > now) {
      ++q;
      continue;
    }
    QueryDone done = std::move(q->second->done);
    const uint16_t node = q->second->node;
    q = queries_.erase(q);
    done(PSM2_TIMEOUT, NodeName(node) + "'s daemon did not answer within " +
                           std::to_string(timeout_ms_) + " ms");
  }
}

bool Remote::Poll() {
  bool did = false;
  hw::Event events[64];
  int n = fabric_->Poll(events, 64);
  for (int i = 0; i < n; i++) HandleEvent(events[i]);
  did = n > 0;
  // Parked and paused frames: retried each pass (their receiver may have
  // posted receives, released inbox chunks, drained its completions).
  for (auto& [node, peer] : peers_) {
    Peer& p = *peer;
    did |= RetryParked(p);
    if (p.rx != Peer::Rx::kPaused) continue;
    if (p.f.op == kRndvData) {
      hw::Event e;
      e.conn = p.conn;
      e.fields = p.f;
      e.length = p.length;
      OnHeader(p, e);
      if (p.rx != Peer::Rx::kPaused) did = true;
    } else if (Admit(p) == Verdict::kDone || Park(p, /*chunk=*/false)) {
      did = true;
      if (p.rx == Peer::Rx::kPaused) RecvNext(p);
    }
  }
  if (++passes_ % 256 == 0) {
    if (!queries_.empty()) CheckDeadlines();
    if (NowMs() - last_liveness_ms_ >= 100) CheckLiveness();
  }
  if (did) engine_->NotifyClients();
  return did;
}

void Remote::CheckLiveness() {
  const uint64_t now = NowMs();
  if (peers_.empty()) {  // the worker may sleep for good: no baseline
    last_liveness_ms_ = 0;
    return;
  }
  const uint64_t ping_ms = std::max<uint64_t>(timeout_ms_ / 3, 1);
  // Checks come every 100 ms while busy and every sixth of the timeout while
  // idle (SleepLimitMs). A gap over a third of the timeout means this worker
  // did not run (the host paused the VM, or the machine starved us), and a
  // peer cannot be blamed for silence nobody was listening to: its pings may
  // be waiting in our socket. Only the idle period of the gap counts against
  // it, so a worker starved for good still finds a dead peer, within about
  // seven such checks.
  const uint64_t gap = now - last_liveness_ms_;
  const uint64_t period_ms = std::max<uint64_t>(timeout_ms_ / 6, 1);
  const bool stalled = last_liveness_ms_ != 0 && gap > ping_ms;
  if (stalled) {
    spdlog::info(
        "fabric: liveness checked after {} ms (the worker did not "
        "run); {} ms of it not counted against peers",
        gap, gap - period_ms);
  }
  last_liveness_ms_ = now;
  std::vector<uint16_t> dead;
  for (auto& [node, peer] : peers_) {
    Peer& p = *peer;
    if (!p.open || p.dropped) continue;
    if (stalled) {
      p.last_recv_ms = std::min(now, p.last_recv_ms + (gap - period_ms));
    }
    if (p.rx != Peer::Rx::kPaused && now - p.last_recv_ms > timeout_ms_) {
      dead.push_back(node);
      continue;
    }
    // Behind queued frames a ping adds nothing (the peer hears those).
    if (now - p.last_sent_ms >= ping_ms && p.queue.empty()) {
      hw::FrameFields none;
      SendControl(node, kPing, 0, 0, none, 0, 0);
    }
  }
  for (uint16_t node : dead) {
    spdlog::warn("fabric: node {} silent for {} ms; closing its connection",
                 node, timeout_ms_);
    Peer* p = PeerOf(node);
    const hw::ConnId conn = p->conn;
    FailPeer(node, hw::ErrorClass::kTimeout);
    fabric_->Close(conn);
  }
}

int Remote::SleepLimitMs() {
  for (const auto& [node, p] : peers_) {
    if (p->rx == Peer::Rx::kPaused || !p->parked.empty() ||
        !p->gone_after.empty() || !p->kept_chunks.empty()) {
      return 1;
    }
  }
  CheckLiveness();
  if (!queries_.empty()) {
    CheckDeadlines();
    return 50;
  }
  // Wake to send and check heartbeats.
  return peers_.empty() ? -1 : static_cast<int>(std::max(timeout_ms_ / 6, 1u));
}

}  // namespace psmd
