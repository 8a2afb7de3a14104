#include "client/identify.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "version/version.h"

namespace psmd::client {

namespace {

bool Wanted() {
  const char* v = getenv("PSM2_IDENTIFY");
  return v != nullptr && v[0] != '\0';
}

// Intel's label for the process: host name and pid.
std::string Label() {
  char host[HOST_NAME_MAX + 1] = "";
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + "." + std::to_string(getpid());
}

}  // namespace

void IdentifyLibrary() {
  if (!Wanted()) return;
  Dl_info info{};
  // psm2_init is this library's own entry point, so dladdr names the file
  // it came from: libpsm2.so.2, libpsmclient.so.0 or a static link.
  const char* path =
      dladdr(reinterpret_cast<void*>(&psm2_init), &info) && info.dli_fname
          ? info.dli_fname
          : "libpsm2 not available";
  fprintf(stderr, "%s: PSM2: psmd %s (commit %s) version: %d.%d, from %s\n",
          Label().c_str(), version::Version(), version::Commit(),
          PSM2_VERNO_MAJOR, PSM2_VERNO_MINOR, path);
}

void IdentifyEndpoint(psm2_epid_t epid, const std::string& daemon_version,
                      const std::string& socket) {
  if (!Wanted()) return;
  fprintf(stderr, "%s: PSM2: endpoint %#" PRIx64 " served by psmd %s at %s\n",
          Label().c_str(), epid,
          daemon_version.empty() ? "(version not reported)"
                                 : daemon_version.c_str(),
          socket.c_str());
}

}  // namespace psmd::client
