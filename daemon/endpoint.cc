#include "daemon/endpoint.h"

#include <unistd.h>

namespace psmd {

Endpoint::~Endpoint() {
  if (doorbell_fd >= 0) close(doorbell_fd);
}

}  // namespace psmd
