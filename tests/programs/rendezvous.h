// Epid exchange for test and benchmark programs: each rank writes its epid to
// DIR/rankN.epid and reads its peer's, as a job launcher (PMIx) would.
#ifndef PSMD_TESTS_PROGRAMS_RENDEZVOUS_H_
#define PSMD_TESTS_PROGRAMS_RENDEZVOUS_H_

#include <psm2.h>

#include <string>

namespace psmd::testing {

// Publishes `epid` for `rank` under `dir` (atomically: write then rename).
bool PublishEpid(const std::string& dir, int rank, psm2_epid_t epid);

// Waits up to timeout_s for `rank`'s epid to appear under `dir`.
bool AwaitEpid(const std::string& dir, int rank, double timeout_s, psm2_epid_t* epid);

// Parses a job uuid written as 32 hex digits (dashes allowed).
bool ParseUuid(const std::string& text, psm2_uuid_t out);

// Exits(2) after printing `what` and the PSM2 error unless err is PSM2_OK.
void CheckPsm(psm2_error_t err, const char* what);

// Opens an endpoint after psm2_init; prints the PSM2 error and exits(2) on
// failure. Returns the epid through *epid.
void InitAndOpen(const psm2_uuid_t uuid, psm2_ep_t* ep, psm2_epid_t* epid);

}  // namespace psmd::testing

#endif  // PSMD_TESTS_PROGRAMS_RENDEZVOUS_H_
