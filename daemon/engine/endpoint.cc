#include "daemon/engine/endpoint.h"

#include <unistd.h>

namespace psmd {

Endpoint::~Endpoint() {
  if (doorbell_fd >= 0) close(doorbell_fd);
  if (pidfd.load() >= 0) close(pidfd.load());
}

}  // namespace psmd
