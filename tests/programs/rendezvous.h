// Epid exchange for test and benchmark programs: each rank writes its epid to
// DIR/rankN.epid and reads its peer's, as a job launcher (PMIx) would.
#ifndef PSMD_TESTS_PROGRAMS_RENDEZVOUS_H_
#define PSMD_TESTS_PROGRAMS_RENDEZVOUS_H_

#include <psm2.h>
#include <psm2_mq.h>

#include <string>

namespace psmd::testing {

// Publishes `epid` for `rank` under `dir` (atomically: write then rename).
bool PublishEpid(const std::string& dir, int rank, psm2_epid_t epid);

// Waits up to timeout_s for `rank`'s epid to appear under `dir`.
bool AwaitEpid(const std::string& dir, int rank, double timeout_s,
               psm2_epid_t* epid);

// Parses a job uuid written as 32 hex digits (dashes allowed).
bool ParseUuid(const std::string& text, psm2_uuid_t out);

// A tag whose first word is `t` (the others 0), and the selector that
// matches a tag exactly.
psm2_mq_tag_t TagOf(uint32_t t);
psm2_mq_tag_t ExactSelector();

// Exits(2) after printing `what` and the PSM2 error unless err is PSM2_OK.
void CheckPsm(psm2_error_t err, const char* what);

// Opens an endpoint after psm2_init; prints the PSM2 error and exits(2) on
// failure. Returns the epid through *epid.
void InitAndOpen(const psm2_uuid_t uuid, psm2_ep_t* ep, psm2_epid_t* epid);

// InitAndOpen, then the endpoint's MQ (ordered, default options).
psm2_mq_t InitOpenWithMq(const psm2_uuid_t uuid, psm2_ep_t* ep,
                         psm2_epid_t* epid);

// The two-rank start of most programs: an endpoint and its MQ, epids
// exchanged through `dir`, connected to rank 1 - rank.
struct ConnectedPair {
  psm2_ep_t ep = nullptr;
  psm2_mq_t mq = nullptr;
  psm2_epid_t self_epid = 0;
  psm2_epid_t peer_epid = 0;
  psm2_epaddr_t peer = nullptr;
};

// Prints what failed and exits(2) on any failure.
ConnectedPair OpenAndConnect(const psm2_uuid_t uuid, const std::string& dir,
                             int rank);

}  // namespace psmd::testing

#endif  // PSMD_TESTS_PROGRAMS_RENDEZVOUS_H_
