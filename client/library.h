// Process-wide state of libpsmclient: initialization, the control client,
// the open endpoints, error handlers, and what the core API remembers about
// connections (for psm2_ep_epid_lookup, labels, host names).
//
// Thread-safety: the fields below are guarded by `mu`; error handlers by a
// mutex of their own. Both are leaf locks: nothing else is acquired while
// either is held, so they may be taken with an endpoint's mutex held (error
// reports from inside progress) and are never held while a user callback
// runs.
#ifndef PSMD_CLIENT_LIBRARY_H_
#define PSMD_CLIENT_LIBRARY_H_

#include <psm2.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/control_client.h"
#include "client/endpoint.h"
#include "shm/epid.h"

namespace psmd::client {

// Bit of PSM2_CORE_OPT_DEBUG (Intel's __HFI_INFO, on by default) that makes
// libpsmclient print each error report on stderr.
inline constexpr uint32_t kDebugPrintErrors = 0x1;

// "0x..." for messages.
std::string EpidText(psm2_epid_t epid);

struct Library {
  static Library& Get();

  // The control client for the current $PSMD_SOCKET (created on first use).
  ControlClient* control();

  // Reports an error: prints `message` (the thing and the fix) on stderr
  // unless PSM2_NO_VERBOSE_ERRORS is set or the debug mask's
  // kDebugPrintErrors bit is clear; then, as Intel's PSM2 does, hands it to
  // the error handler of `ep` (the global one when ep is null or not open)
  // and returns what the handler returns: `code` itself for
  // PSM2_ERRHANDLER_NO_HANDLER, the default. PSM2_ERRHANDLER_PSM_HANDLER
  // ends the process. PSM2_OK is returned untouched. Never call with `mu`
  // held: a handler may call back into the library.
  static psm2_error_t Report(psm2_error_t code, const std::string& message);
  static psm2_error_t Report(psm2_ep_t ep, psm2_error_t code,
                             const std::string& message);
  // PSM2_PARAM_ERR on behalf of `function`; `what` says which argument is
  // wrong and what it must be.
  static psm2_error_t BadArgument(const char* function,
                                  const std::string& what) {
    return Report(PSM2_PARAM_ERR, std::string(function) + ": " + what);
  }
  // PSM2_EP_WAS_CLOSED on behalf of `function`: ep's psmd went away.
  static psm2_error_t DaemonGone(psm2_ep_t ep, const char* function);
  static psm2_error_t Report(psm2_ep_t ep, const Status& status) {
    return Report(ep, status.code, status.message);
  }
  // Prints a warning (no error: no handler runs) under the same rule as
  // Report's printing.
  static void Warn(const std::string& message);

  // PSM2_OK while psm2_init is in effect; otherwise reports
  // PSM2_INIT_NOT_INIT on behalf of `function`.
  psm2_error_t RequireInit(const char* function);

  // Whether ep is one of this process's open endpoints. Requires `mu`.
  bool IsOpenLocked(psm2_ep_t ep) const;

  // Error handlers (psm2_error_register_handler). An endpoint takes the
  // global handler current when it opens.
  void SetGlobalHandler(psm2_ep_errhandler_t handler);
  // False if ep is not open.
  bool SetEndpointHandler(psm2_ep_t ep, psm2_ep_errhandler_t handler);
  void AdoptGlobalHandler(psm2_ep_t ep);
  void ForgetEndpointHandler(psm2_ep_t ep);

  // `"label" (epid 0x...) on host` for diagnostics: the label given to
  // `epaddr` with psm2_epaddr_setlabel and the host name given to the epid's
  // node with psm2_map_nid_hostname, else the one psmd's node table gave
  // psm2_ep_connect, where known. Takes `mu`.
  std::string Describe(psm2_epid_t epid, psm2_epaddr_t epaddr = nullptr);

  std::mutex mu;
  // psm2_init references; the last psm2_finalize moves to `finalized`, after
  // which psm2_init fails with PSM2_IS_FINALIZED, as Intel's does.
  int init_count = 0;
  bool finalized = false;
  // PSM2_MULTI_EP, read by the first psm2_init: more than one endpoint per
  // process only when set (Intel's rule).
  bool multi_ep = false;
  int opening =
      0;  // psm2_ep_open calls between their limit check and completion
  std::vector<std::unique_ptr<psm2_ep>> endpoints;  // in open order
  // Epaddrs returned by psm2_ep_connect, per endpoint: what
  // psm2_ep_epid_lookup finds. Disconnecting keeps them (as Intel does).
  std::unordered_map<psm2_ep_t, std::unordered_map<psm2_epid_t, psm2_epaddr_t>>
      connected;
  std::unordered_map<psm2_epaddr_t, std::string>
      labels;  // psm2_epaddr_setlabel
  std::unordered_map<uint64_t, std::string>
      hostnames;  // psm2_map_nid_hostname, by nid
  std::unordered_map<uint64_t, std::string>
      table_hostnames;  // psmd's node table (ConnectResult.host), by nid
  // PSM2_CORE_OPT_DEBUG. Atomic: read by every report without `mu`.
  std::atomic<uint32_t> debug_mask{kDebugPrintErrors};

 private:
  // "libpsmclient: KIND MESSAGE" on stderr unless PSM2_NO_VERBOSE_ERRORS is
  // set or the debug mask's kDebugPrintErrors bit is clear.
  static void Print(const char* kind, const std::string& message);

  std::unique_ptr<ControlClient> control_;

  std::mutex handlers_mu_;
  psm2_ep_errhandler_t global_handler_ = PSM2_ERRHANDLER_NO_HANDLER;
  std::unordered_map<psm2_ep_t, psm2_ep_errhandler_t> ep_handlers_;
};

}  // namespace psmd::client

#endif  // PSMD_CLIENT_LIBRARY_H_
