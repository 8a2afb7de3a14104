// Library state, error reporting and the error-handler API of psm2.h
// (psm2_error_register_handler, psm2_error_defer).
#include "client/library.h"

#include <psm2.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// The token an error handler receives: what psm2_error_defer needs to hand
// the error to the built-in handler. Lives on the reporting call's stack,
// valid only during the handler.
struct psm2_error_token {
  psm2_ep_t ep;
  psm2_error_t error;
  char message[PSM2_ERRSTRING_MAXLEN];
};

namespace psmd::client {

namespace {

// PSM2_ERRHANDLER_PSM_HANDLER: print and end the process, as Intel's does
// (exit status 255; abort for an internal error, which means a bug).
// Intel's also sleeps 3 s first so that the line makes it through ssh; we
// flush instead.
[[noreturn]] void PsmHandler(psm2_error_t code, const char* message) {
  fprintf(stderr, "libpsmclient: %s\n", message);
  fflush(stdout);
  fflush(stderr);
  if (code == PSM2_INTERNAL_ERR) abort();
  exit(255);
}

bool VerboseErrors() {
  const char* quiet = getenv("PSM2_NO_VERBOSE_ERRORS");
  return quiet == nullptr || quiet[0] == '\0';
}

}  // namespace

std::string EpidText(psm2_epid_t epid) {
  char hex[24];
  snprintf(hex, sizeof(hex), "%#" PRIx64, epid);
  return hex;
}

Library& Library::Get() {
  static Library* lib =
      new Library();  // never destroyed: handles may outlive exit
  return *lib;
}

ControlClient* Library::control() {
  std::lock_guard<std::mutex> lock(mu);
  std::string path = SocketPath();
  if (!control_ || control_->socket_path() != path) {
    control_ = std::make_unique<ControlClient>(path);
  }
  return control_.get();
}

psm2_error_t Library::Report(psm2_error_t code, const std::string& message) {
  return Report(nullptr, code, message);
}

psm2_error_t Library::Report(psm2_ep_t ep, psm2_error_t code,
                             const std::string& message) {
  if (code == PSM2_OK) return code;
  Library& lib = Get();
  psm2_ep_errhandler_t handler;
  {
    std::lock_guard<std::mutex> lock(lib.handlers_mu_);
    auto it =
        ep != nullptr ? lib.ep_handlers_.find(ep) : lib.ep_handlers_.end();
    handler = it != lib.ep_handlers_.end() ? it->second : lib.global_handler_;
    if (it == lib.ep_handlers_.end()) ep = nullptr;  // not (or no longer) open
  }
  psm2_error_token token{ep, code, {}};
  snprintf(token.message, sizeof(token.message), "%s", message.c_str());
  if (handler == PSM2_ERRHANDLER_PSM_HANDLER) PsmHandler(code, token.message);
  Print("", message);  // in full; handlers get 511 bytes
  if (handler == PSM2_ERRHANDLER_NO_HANDLER) return code;
  return handler(ep, code, token.message, &token);
}

void Library::Warn(const std::string& message) { Print("warning: ", message); }

void Library::Print(const char* kind, const std::string& message) {
  if ((Get().debug_mask.load(std::memory_order_relaxed) & kDebugPrintErrors) &&
      VerboseErrors()) {
    fprintf(stderr, "libpsmclient: %s%s\n", kind, message.c_str());
  }
}

psm2_error_t Library::DaemonGone(psm2_ep_t ep, const char* function) {
  return Report(ep, PSM2_EP_WAS_CLOSED,
                std::string(function) + ": endpoint " +
                    std::to_string(ep->id()) + " lost psmd (" +
                    ep->control()->socket_path() +
                    "); close it and open a new one once psmd is back");
}

psm2_error_t Library::RequireInit(const char* function) {
  bool was_finalized;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (init_count > 0) return PSM2_OK;
    was_finalized = finalized;
  }
  return Report(
      PSM2_INIT_NOT_INIT,
      std::string(function) +
          (was_finalized
               ? ": PSM2 was finalized in this process (psm2_finalize was "
                 "called as often as psm2_init)"
               : ": PSM2 is not initialized (call psm2_init first)"));
}

bool Library::IsOpenLocked(psm2_ep_t ep) const {
  return ep != nullptr &&
         std::any_of(endpoints.begin(), endpoints.end(),
                     [ep](const auto& open) { return open.get() == ep; });
}

void Library::SetGlobalHandler(psm2_ep_errhandler_t handler) {
  std::lock_guard<std::mutex> lock(handlers_mu_);
  global_handler_ = handler;
}

bool Library::SetEndpointHandler(psm2_ep_t ep, psm2_ep_errhandler_t handler) {
  std::lock_guard<std::mutex> lock(handlers_mu_);
  auto it = ep_handlers_.find(ep);
  if (it == ep_handlers_.end()) return false;
  it->second = handler;
  return true;
}

void Library::AdoptGlobalHandler(psm2_ep_t ep) {
  std::lock_guard<std::mutex> lock(handlers_mu_);
  ep_handlers_[ep] = global_handler_;
}

void Library::ForgetEndpointHandler(psm2_ep_t ep) {
  std::lock_guard<std::mutex> lock(handlers_mu_);
  ep_handlers_.erase(ep);
}

std::string Library::Describe(psm2_epid_t epid, psm2_epaddr_t epaddr) {
  std::string text = "epid " + EpidText(epid);
  std::lock_guard<std::mutex> lock(mu);
  auto label = epaddr != nullptr ? labels.find(epaddr) : labels.end();
  if (label != labels.end()) text = "\"" + label->second + "\" (" + text + ")";
  const uint64_t nid = psmd::shm::NodeIdOf(epid);
  auto host = hostnames.find(nid);
  if (host == hostnames.end()) {
    host = table_hostnames.find(nid);
    if (host == table_hostnames.end()) return text;
  }
  text += " on " + host->second;
  return text;
}

}  // namespace psmd::client

using psmd::client::Library;

extern "C" {

psm2_error_t psm2_error_register_handler(
    psm2_ep_t ep, const psm2_ep_errhandler_t errhandler) {
  // A null function pointer is neither special value; calling it later would
  // crash inside some unrelated PSM2 call, so refuse it now.
  if (errhandler == nullptr) {
    return Library::Report(
        ep, PSM2_PARAM_ERR,
        "psm2_error_register_handler: the handler is NULL (pass a function, "
        "PSM2_ERRHANDLER_NO_HANDLER or PSM2_ERRHANDLER_PSM_HANDLER)");
  }
  Library& lib = Library::Get();
  if (ep == nullptr) {
    lib.SetGlobalHandler(errhandler);
    return PSM2_OK;
  }
  if (!lib.SetEndpointHandler(ep, errhandler)) {
    return Library::Report(
        PSM2_EP_WAS_CLOSED,
        "psm2_error_register_handler: the endpoint is not open (closed "
        "already, or never returned by psm2_ep_open)");
  }
  return PSM2_OK;
}

psm2_error_t psm2_error_defer(psm2_error_token_t err_token) {
  // Not reported: this is called from inside an error handler, and reporting
  // would run that handler again.
  if (err_token == nullptr) return PSM2_PARAM_ERR;
  psmd::client::PsmHandler(err_token->error, err_token->message);
}

}  // extern "C"
