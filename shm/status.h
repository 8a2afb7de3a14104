// The one error type of psmd, on both sides of the wire and of the control
// plane: a PSM2 error code and a message for the person who has to act on
// it (what failed, and the fix). The codes are psm2_error_t everywhere:
// in gRPC error details, in the attach reply, in completions, and in what
// the library reports through psm2_error_register_handler.
//
// Thread-safety: a plain value.
#ifndef PSMD_SHM_STATUS_H_
#define PSMD_SHM_STATUS_H_

#include <psm2.h>

#include <string>
#include <utility>

namespace psmd {

struct Status {
  Status() = default;
  Status(psm2_error_t c, std::string m) : code(c), message(std::move(m)) {}

  bool ok() const { return code == PSM2_OK; }

  psm2_error_t code = PSM2_OK;
  std::string message;
};

}  // namespace psmd

#endif  // PSMD_SHM_STATUS_H_
