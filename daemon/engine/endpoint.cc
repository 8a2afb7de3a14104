#include "daemon/engine/endpoint.h"

#include <unistd.h>

namespace psmd {

Endpoint::~Endpoint() {
  if (identity_.doorbell_fd >= 0) close(identity_.doorbell_fd);
  if (pidfd.load() >= 0) close(pidfd.load());
}

}  // namespace psmd
