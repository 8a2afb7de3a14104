// psm2.h: library, endpoint and connection functions of libpsmclient.
#include <psm2.h>
#include <psm2_mq.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "client/control_client.h"
#include "client/endpoint.h"
#include "client/library.h"

using psmd::client::Library;

namespace psmd::client {

Library& Library::Get() {
  static Library* lib = new Library();  // never destroyed: handles may outlive exit
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
  if (code != PSM2_OK) fprintf(stderr, "libpsmclient: %s\n", message.c_str());
  return code;
}

}  // namespace psmd::client

extern "C" {

psm2_error_t psm2_init(int* api_verno_major, int* api_verno_minor) {
  if (api_verno_major == nullptr || api_verno_minor == nullptr) return PSM2_PARAM_ERR;
  if (*api_verno_major != PSM2_VERNO_MAJOR && *api_verno_major != PSM2_VERNO_COMPAT_MAJOR) {
    *api_verno_major = PSM2_VERNO_MAJOR;
    *api_verno_minor = PSM2_VERNO_MINOR;
    return PSM2_INIT_BAD_API_VERSION;
  }
  *api_verno_major = PSM2_VERNO_MAJOR;
  *api_verno_minor = PSM2_VERNO_MINOR;
  Library& lib = Library::Get();
  std::lock_guard<std::mutex> lock(lib.mu);
  lib.initialized = true;
  return PSM2_OK;
}

psm2_error_t psm2_finalize(void) {
  Library& lib = Library::Get();
  std::vector<psm2_ep_t> open;
  {
    std::lock_guard<std::mutex> lock(lib.mu);
    if (!lib.initialized) return PSM2_INIT_NOT_INIT;
    for (auto& ep : lib.endpoints) open.push_back(ep.get());
  }
  for (psm2_ep_t ep : open) psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, 0);
  std::lock_guard<std::mutex> lock(lib.mu);
  lib.initialized = false;
  return PSM2_OK;
}

const char* psm2_error_get_string(psm2_error_t error) {
  switch (error) {
    case PSM2_OK: return "Success";
    case PSM2_OK_NO_PROGRESS: return "No events progressed";
    case PSM2_PARAM_ERR: return "Error in a function parameter";
    case PSM2_NO_MEMORY: return "Insufficient memory";
    case PSM2_INIT_NOT_INIT: return "PSM2 has not been initialized";
    case PSM2_INIT_BAD_API_VERSION: return "Incompatible PSM2 API version";
    case PSM2_NO_AFFINITY: return "No affinity available";
    case PSM2_INTERNAL_ERR: return "Unknown internal error";
    case PSM2_SHMEM_SEGMENT_ERR: return "Shared memory segment error";
    case PSM2_OPT_READONLY: return "Option is read-only";
    case PSM2_TIMEOUT: return "Operation timed out";
    case PSM2_TOO_MANY_ENDPOINTS: return "Exceeded supported amount of endpoints";
    case PSM2_IS_FINALIZED: return "PSM2 is finalized";
    case PSM2_EP_WAS_CLOSED: return "Endpoint was closed";
    case PSM2_EP_NO_DEVICE: return "No device (psmd) available";
    case PSM2_EP_UNIT_NOT_FOUND: return "Specified unit was not found";
    case PSM2_EP_DEVICE_FAILURE: return "Device failure";
    case PSM2_EP_CLOSE_TIMEOUT: return "Endpoint close timed out";
    case PSM2_EP_NO_PORTS_AVAIL: return "No free ports could be obtained";
    case PSM2_EP_NO_NETWORK: return "Network is down";
    case PSM2_EP_INVALID_UUID_KEY: return "Invalid job key";
    case PSM2_EP_NO_RESOURCES: return "No resources available";
    case PSM2_EPID_UNKNOWN: return "Unknown endpoint id";
    case PSM2_EPID_UNREACHABLE: return "Endpoint id is unreachable";
    case PSM2_EPID_INVALID_NODE: return "Invalid node in endpoint id";
    case PSM2_EPID_INVALID_MTU: return "Invalid MTU";
    case PSM2_EPID_INVALID_UUID_KEY: return "Remote endpoint belongs to another job (uuid key)";
    case PSM2_EPID_INVALID_VERSION: return "Remote endpoint runs an incompatible version";
    case PSM2_EPID_INVALID_CONNECT: return "Invalid connection request";
    case PSM2_EPID_ALREADY_CONNECTED: return "Endpoint is already connected";
    case PSM2_EPID_NETWORK_ERROR: return "Network error while connecting";
    case PSM2_EPID_INVALID_PKEY: return "Invalid partition key";
    case PSM2_EPID_PATH_RESOLUTION: return "Path resolution failed";
    case PSM2_MQ_NO_COMPLETIONS: return "No completion events available";
    case PSM2_MQ_TRUNCATION: return "Message was truncated";
    case PSM2_AM_INVALID_REPLY: return "Invalid active message reply";
    case PSM2_IQ_INVALID_QUERY: return "Invalid info query";
    default: return "Unknown PSM2 error";
  }
}

psm2_error_t psm2_ep_open(const psm2_uuid_t unique_job_key, const struct psm2_ep_open_opts* opts,
                          psm2_ep_t* ep, psm2_epid_t* epid) {
  Library& lib = Library::Get();
  {
    std::lock_guard<std::mutex> lock(lib.mu);
    if (!lib.initialized) return PSM2_INIT_NOT_INIT;
  }
  if (unique_job_key == nullptr || ep == nullptr || epid == nullptr) return PSM2_PARAM_ERR;
  (void)opts;  // psmd decides resources; unit, affinity and timeouts do not apply
  std::unique_ptr<psm2_ep> opened;
  psmd::client::CallError err = psm2_ep::Open(lib.control(), unique_job_key, &opened);
  if (!err.ok()) return Library::Report(static_cast<psm2_error_t>(err.code), err.message);
  *ep = opened.get();
  *epid = opened->epid;
  std::lock_guard<std::mutex> lock(lib.mu);
  lib.endpoints.push_back(std::move(opened));
  return PSM2_OK;
}

psm2_error_t psm2_ep_close(psm2_ep_t ep, int mode, int64_t timeout) {
  (void)mode;
  (void)timeout;
  if (ep == nullptr) return PSM2_PARAM_ERR;
  Library& lib = Library::Get();
  std::unique_ptr<psm2_ep> owned;
  {
    std::lock_guard<std::mutex> lock(lib.mu);
    for (auto it = lib.endpoints.begin(); it != lib.endpoints.end(); ++it) {
      if (it->get() == ep) {
        owned = std::move(*it);
        lib.endpoints.erase(it);
        break;
      }
    }
  }
  if (!owned) return PSM2_PARAM_ERR;
  psmd::client::CallError err;
  if (!owned->daemon_lost) err = owned->control->CloseEndpoint(owned->id);
  // Unmapping and closing the fds (the destructor) releases the segments;
  // closing the attach connection tells the daemon in any case.
  return err.ok() ? PSM2_OK : Library::Report(static_cast<psm2_error_t>(err.code), err.message);
}

psm2_error_t psm2_ep_connect(psm2_ep_t ep, int num_of_epid, const psm2_epid_t* array_of_epid,
                             const int* array_of_epid_mask, psm2_error_t* array_of_errors,
                             psm2_epaddr_t* array_of_epaddr, int64_t timeout) {
  (void)timeout;  // connections are local control operations: no waiting
  if (ep == nullptr || num_of_epid < 0 || (num_of_epid > 0 && array_of_epid == nullptr) ||
      (num_of_epid > 0 && (array_of_errors == nullptr || array_of_epaddr == nullptr))) {
    return PSM2_PARAM_ERR;
  }
  std::vector<uint64_t> wanted;
  std::vector<int> index_of;
  for (int i = 0; i < num_of_epid; i++) {
    if (array_of_epid_mask != nullptr && array_of_epid_mask[i] == 0) continue;
    wanted.push_back(array_of_epid[i]);
    index_of.push_back(i);
  }
  if (wanted.empty()) return PSM2_OK;
  psmd::v1::ConnectReply reply;
  psmd::client::CallError err = ep->control->Connect(ep->id, wanted, &reply);
  if (!err.ok() || reply.results_size() != static_cast<int>(wanted.size())) {
    for (int i : index_of) array_of_errors[i] = static_cast<psm2_error_t>(err.code);
    return Library::Report(static_cast<psm2_error_t>(err.ok() ? PSM2_INTERNAL_ERR : err.code),
                           err.message);
  }
  psm2_error_t first_error = PSM2_OK;
  std::lock_guard<std::recursive_mutex> lock(ep->mu);
  for (size_t k = 0; k < wanted.size(); k++) {
    int i = index_of[k];
    const psmd::v1::ConnectResult& r = reply.results(static_cast<int>(k));
    array_of_errors[i] = static_cast<psm2_error_t>(r.error());
    if (r.error() != PSM2_OK) {
      array_of_epaddr[i] = nullptr;
      if (first_error == PSM2_OK) first_error = static_cast<psm2_error_t>(r.error());
      if (!r.message().empty()) fprintf(stderr, "libpsmclient: psm2_ep_connect: %s\n", r.message().c_str());
      continue;
    }
    psm2_epaddr_t addr = ep->EpaddrFor(wanted[k]);
    addr->slot = r.slot();
    array_of_epaddr[i] = addr;
  }
  return first_error;
}

psm2_error_t psm2_poll(psm2_ep_t ep) {
  if (ep == nullptr) return PSM2_PARAM_ERR;
  std::lock_guard<std::recursive_mutex> lock(ep->mu);
  return ep->Progress() ? PSM2_OK : PSM2_OK_NO_PROGRESS;
}

}  // extern "C"
