// The options of a matched queue (psm2_mq_getopt/setopt, psm2_getopt/setopt
// with PSM2_COMPONENT_MQ, psm2_mq_init's option list), and the PSM2
// environment variables that preset them:
//   PSM2_MQ_RNDV_SHM_THRESH   PSM2_MQ_RNDV_SHM_SZ   rendezvous above this size
//   PSM2_MQ_RNDV_HFI_THRESH   PSM2_MQ_RNDV_HFI_SZ   kept and reported (no
//   fabric) PSM2_MQ_MAX_SYSBUF_MBYTES PSM2_MQ_MAX_SYSBUF_MBYTES  unexpected
//   budget, MiB
// The budget is enforced by psmd (daemon/engine/mq_engine.h, invariant 4), so
// setting it is a round trip to the daemon.
//
// Thread-safety: each function takes the endpoint's mutex itself; call them
// without holding it.
#ifndef PSMD_CLIENT_MQ_OPTIONS_H_
#define PSMD_CLIENT_MQ_OPTIONS_H_

#include <psm2.h>
#include <psm2_mq.h>

#include <cstdint>

namespace psmd::client {

// Default rendezvous threshold of psmd's (node-local) path, in bytes.
inline constexpr uint32_t kDefaultRndvBytes = 64000;

// Sets the defaults and applies the environment. Fails (naming the variable)
// on a malformed or out-of-range value.
psm2_error_t InitMqOptions(psm2_mq_t mq);

psm2_error_t GetMqOption(psm2_mq_t mq, int option, uint32_t* value);
psm2_error_t SetMqOption(psm2_mq_t mq, int option, uint64_t value);

}  // namespace psmd::client

#endif  // PSMD_CLIENT_MQ_OPTIONS_H_
