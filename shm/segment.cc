#include "shm/segment.h"

#include <cstring>

namespace psmd::shm {

void WriteSegmentHeader(void* base, const SegmentParams& p) {
  SegmentHeader* h = HeaderOf(base);
  h->magic = kSegmentMagic;
  h->version = kLayoutVersion;
  h->endpoint_id = p.endpoint_id;
  h->epid = p.epid;
  h->segment_bytes = p.geometry.bytes;
  h->sq_capacity = p.geometry.sq_capacity;
  h->cq_capacity = p.geometry.cq_capacity;
  h->msg_sq_offset = p.geometry.msg_sq_offset;
  h->ctl_sq_offset = p.geometry.ctl_sq_offset;
  h->cq_offset = p.geometry.cq_offset;
  h->pool_bytes = p.pool_bytes;
  h->region_offset = p.region_offset;
  h->region_bytes = p.region_bytes;
  h->inline_max = kInlineMax;
  h->unexpected_budget = p.unexpected_budget;
  h->max_unexpected_budget = p.max_unexpected_budget;
}

bool ReadSegmentHeader(const void* base, uint64_t segment_bytes,
                       uint64_t pool_bytes, SegmentParams* out,
                       std::string* why) {
  // Copied out first: the checks and the caller use one consistent copy.
  SegmentHeader h;
  std::memcpy(&h, base, sizeof(h));
  const SegmentGeometry g = ComputeGeometry(h.sq_capacity, h.cq_capacity);
  const bool fits = h.region_offset <= pool_bytes &&
                    h.region_bytes <= pool_bytes - h.region_offset;
  if (h.magic != kSegmentMagic || h.version != kLayoutVersion ||
      !IsPowerOfTwo(h.sq_capacity) || !IsPowerOfTwo(h.cq_capacity) ||
      g.bytes != segment_bytes || h.segment_bytes != segment_bytes ||
      g.msg_sq_offset != h.msg_sq_offset ||
      g.ctl_sq_offset != h.ctl_sq_offset || g.cq_offset != h.cq_offset ||
      h.pool_bytes != pool_bytes || !fits || h.inline_max != kInlineMax) {
    *why =
        "segment layout does not match this library (psmd and libpsmclient "
        "from different versions?)";
    return false;
  }
  out->endpoint_id = h.endpoint_id;
  out->epid = h.epid;
  out->geometry = g;
  out->pool_bytes = h.pool_bytes;
  out->region_offset = h.region_offset;
  out->region_bytes = h.region_bytes;
  out->unexpected_budget = h.unexpected_budget;
  out->max_unexpected_budget = h.max_unexpected_budget;
  return true;
}

ClientRings ClientRingsOf(void* base, const SegmentGeometry& g) {
  ClientRings r;
  r.control = ControlOf(base);
  r.msg_sq = RingProducer<SubmissionDesc>(
      &r.control->msg_sq, MessageSlotsOf(base, g), g.sq_capacity);
  r.ctl_sq = RingProducer<SubmissionDesc>(
      &r.control->ctl_sq, ControlSlotsOf(base, g), g.sq_capacity);
  r.cq = RingConsumer<CompletionDesc>(
      &r.control->cq, CompletionSlotsOf(base, g), g.cq_capacity);
  return r;
}

DaemonRings DaemonRingsOf(void* base, const SegmentGeometry& g,
                          const RingPositions& at) {
  DaemonRings r;
  r.control = ControlOf(base);
  r.msg_sq = RingConsumer<SubmissionDesc>(
      &r.control->msg_sq, MessageSlotsOf(base, g), g.sq_capacity, at.msg_sq);
  r.ctl_sq = RingConsumer<SubmissionDesc>(
      &r.control->ctl_sq, ControlSlotsOf(base, g), g.sq_capacity, at.ctl_sq);
  r.cq = RingProducer<CompletionDesc>(
      &r.control->cq, CompletionSlotsOf(base, g), g.cq_capacity, at.cq);
  return r;
}

}  // namespace psmd::shm
