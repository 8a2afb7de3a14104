// Process-wide state of libpsmclient: initialization, the control client,
// and the open endpoints.
//
// Thread-safety: fields are guarded by `mu`.
#ifndef PSMD_CLIENT_LIBRARY_H_
#define PSMD_CLIENT_LIBRARY_H_

#include <psm2.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/control_client.h"
#include "client/endpoint.h"

namespace psmd::client {

struct Library {
  static Library& Get();

  // The control client for the current $PSMD_SOCKET (created on first use).
  ControlClient* control();

  // Prints `message` (the thing and the fix) and returns `code`.
  static psm2_error_t Report(psm2_error_t code, const std::string& message);

  std::mutex mu;
  bool initialized = false;
  std::vector<std::unique_ptr<psm2_ep>> endpoints;

 private:
  std::unique_ptr<ControlClient> control_;
};

}  // namespace psmd::client

#endif  // PSMD_CLIENT_LIBRARY_H_
