// PSM2_IDENTIFY: with the variable set (to anything non-empty), the library
// says what it is, as Intel's libpsm2 does in psm2_init
// ("<host>.<pid>: PSM2: <revision> version: <major>.<minor>, from <path>"),
// and, since here a daemon does the work, which psmd serves each endpoint.
// Both lines go to stderr, so that a program's own output is untouched.
//
// Thread-safety: both functions may be called from any thread; each writes
// one line with one stdio call.
#ifndef PSMD_CLIENT_IDENTIFY_H_
#define PSMD_CLIENT_IDENTIFY_H_

#include <psm2.h>

#include <string>

namespace psmd::client {

// psm2_init, first reference: the library's version and the file it was
// loaded from (dladdr).
void IdentifyLibrary();

// psm2_ep_open, success: the endpoint, the daemon's version (from the open
// reply) and its socket.
void IdentifyEndpoint(psm2_epid_t epid, const std::string& daemon_version,
                      const std::string& socket);

}  // namespace psmd::client

#endif  // PSMD_CLIENT_IDENTIFY_H_
