// psm2.h: library, endpoint and connection functions of libpsmclient.
#include <psm2.h>
#include <psm2_mq.h>
#include <strings.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/control_client.h"
#include "client/endpoint.h"
#include "client/identify.h"
#include "client/library.h"
#include "shm/epid.h"

using psmd::client::Library;

namespace {

using Clock = std::chrono::steady_clock;

// What psm2_finalize gives each endpoint it closes (Intel's: twice its 2 s
// minimum close timeout).
constexpr int64_t kFinalizeCloseTimeoutNs = 4'000'000'000;
// A graceful close with no timeout (<= 0) waits at most this long, as
// Intel's caps it.
constexpr auto kMaxCloseWait = std::chrono::seconds(60);

// PSM2_MULTI_EP as Intel's reads it: yes/no words or a number.
bool EnvYes(const char* name) {
  const char* v = getenv(name);
  if (v == nullptr || v[0] == '\0') return false;
  char* end = nullptr;
  long n = strtol(v, &end, 0);
  if (end != v) return n != 0;
  return strchr("yYtT", v[0]) != nullptr || strcasecmp(v, "on") == 0;
}

// Intel's ranking of errors (psmi_error_cmp): the one to return when several
// peers failed differently. Errors not in the list rank by value.
psm2_error_t WorseError(psm2_error_t a, psm2_error_t b) {
  static constexpr psm2_error_t kOrder[] = {
      PSM2_NO_MEMORY,
      PSM2_INTERNAL_ERR,
      PSM2_INIT_NOT_INIT,
      PSM2_INIT_BAD_API_VERSION,
      PSM2_EP_NO_DEVICE,
      PSM2_EP_UNIT_NOT_FOUND,
      PSM2_EP_DEVICE_FAILURE,
      PSM2_EP_NO_PORTS_AVAIL,
      PSM2_TOO_MANY_ENDPOINTS,
      PSM2_EP_NO_NETWORK,
      PSM2_SHMEM_SEGMENT_ERR,
      PSM2_EP_CLOSE_TIMEOUT,
      PSM2_EP_INVALID_UUID_KEY,
      PSM2_EP_NO_RESOURCES,
      PSM2_EPID_NETWORK_ERROR,
      PSM2_EPID_INVALID_NODE,
      PSM2_EPID_INVALID_CONNECT,
      PSM2_EPID_INVALID_PKEY,
      PSM2_EPID_INVALID_VERSION,
      PSM2_EPID_INVALID_UUID_KEY,
      PSM2_EPID_INVALID_MTU,
      PSM2_TIMEOUT,
  };
  for (psm2_error_t e : kOrder) {
    if (a == e || b == e) return e;
  }
  return a > b ? a : b;
}

// psm2_ep_open's options, checked as Intel's checks them (-1 and port 0 mean
// "default"). psmd has exactly one unit, 0, with one port, 1. The other
// fields describe HFI resources that psmd decides for itself.
psm2_error_t CheckOpenOptions(const psm2_ep_open_opts& o) {
  std::string bad;
  if (o.timeout < -1) {
    bad = "timeout " + std::to_string(o.timeout) +
          " (use -1 for the default, or >= 0 ns)";
  } else if (o.unit != -1 && o.unit != 0) {
    bad = "unit " + std::to_string(o.unit) +
          " (psmd serves a single unit: use 0, or -1 for any)";
  } else if (o.port != 0 && o.port != 1) {
    bad = "port " + std::to_string(o.port) +
          " (psmd's unit has port 1; 0 means any)";
  } else if (o.affinity != -1 && (o.affinity < PSM2_EP_OPEN_AFFINITY_SKIP ||
                                  o.affinity > PSM2_EP_OPEN_AFFINITY_FORCE)) {
    bad = "affinity " + std::to_string(o.affinity) +
          " (use a PSM2_EP_OPEN_AFFINITY_* value)";
  } else if (o.outsl != -1 && (o.outsl < 0 || o.outsl > 31)) {
    bad = "service level " + std::to_string(o.outsl) +
          " (use 0..31, or -1 for the default)";
  }
  if (bad.empty()) return PSM2_OK;
  return Library::Report(PSM2_PARAM_ERR,
                         "psm2_ep_open: invalid option: " + bad);
}

// How much work ep still holds that only this library can hand to psmd:
// submissions waiting for ring or pool space, and rendezvous sends whose
// payload has not been streamed yet (the receiver needs our copy).
size_t UnfinishedSends(psm2_ep_t ep) PSMD_REQUIRES(ep->mu) {
  size_t n = ep->publisher().queued();
  ep->requests().ForEach([&](const psm2_mq_req* r) PSMD_REQUIRES(ep->mu) {
    if (r->kind == psm2_mq_req::Kind::kSend && r->send_buf != nullptr &&
        r->state != psm2_mq_req::State::kComplete) {
      n++;
    }
  });
  return n;
}

// Graceful close: progresses ep until nothing is owed to psmd or the time is
// up. Returns how many sends were left unfinished.
size_t DrainSends(psm2_ep_t ep, int64_t timeout_ns) {
  const Clock::time_point deadline =
      Clock::now() + (timeout_ns > 0 ? std::chrono::nanoseconds(timeout_ns)
                                     : std::chrono::nanoseconds(kMaxCloseWait));
  psmd::client::EndpointLock lock(&ep->mu);
  size_t left;
  while ((left = UnfinishedSends(ep)) > 0 && !ep->daemon_lost() &&
         Clock::now() < deadline) {
    if (ep->Progress()) continue;
    // Nothing moved: the receivers have to act, unless psmd is gone, when
    // nothing ever will (without this look the loop waits out the whole
    // timeout, 60 s for 0). Let other threads use the endpoint meanwhile.
    if (ep->CheckDaemon()) break;
    lock.Unlock();
    usleep(50);
    lock.Lock();
  }
  return ep->daemon_lost() ? 0 : left;
}

}  // namespace

extern "C" {

psm2_error_t psm2_init(int* api_verno_major, int* api_verno_minor) {
  if (api_verno_major == nullptr || api_verno_minor == nullptr) {
    return Library::Report(
        PSM2_PARAM_ERR,
        "psm2_init: api_verno_major and api_verno_minor must point to the "
        "version the program was built for (PSM2_VERNO_MAJOR/MINOR)");
  }
  Library& lib = Library::Get();
  std::unique_lock<std::mutex> lock(lib.mu);
  // As Intel's: a later psm2_init only takes a reference (whatever version it
  // asks for), and the library cannot come back after its last finalize.
  if (lib.init_count == 0) {
    if (lib.finalized) {
      lock.unlock();
      return Library::Report(
          PSM2_IS_FINALIZED,
          "psm2_init: PSM2 was finalized in this process and cannot be "
          "initialized again");
    }
    if (*api_verno_major != PSM2_VERNO_MAJOR &&
        *api_verno_major != PSM2_VERNO_COMPAT_MAJOR) {
      lock.unlock();
      return Library::Report(PSM2_INIT_BAD_API_VERSION,
                             "psm2_init: this library implements PSM2 API " +
                                 std::to_string(PSM2_VERNO_MAJOR) + "." +
                                 std::to_string(PSM2_VERNO_MINOR) +
                                 " (and 1.x programs), not " +
                                 std::to_string(*api_verno_major) + "." +
                                 std::to_string(*api_verno_minor));
    }
    lib.multi_ep = EnvYes("PSM2_MULTI_EP");
    psmd::client::IdentifyLibrary();
  }
  lib.init_count++;
  *api_verno_major = PSM2_VERNO_MAJOR;
  *api_verno_minor = PSM2_VERNO_MINOR;
  return PSM2_OK;
}

psm2_error_t psm2_finalize(void) {
  Library& lib = Library::Get();
  std::vector<psm2_ep_t> open;
  {
    std::lock_guard<std::mutex> lock(lib.mu);
    if (lib.init_count > 1) {
      lib.init_count--;
      return PSM2_OK;
    }
    if (lib.init_count == 1) {
      for (auto& ep : lib.endpoints) open.push_back(ep.get());
    }
  }
  if (psm2_error_t err = lib.RequireInit("psm2_finalize"); err != PSM2_OK)
    return err;
  // The last reference: close what is open, as Intel's does.
  for (psm2_ep_t ep : open)
    psm2_ep_close(ep, PSM2_EP_CLOSE_GRACEFUL, kFinalizeCloseTimeoutNs);
  std::lock_guard<std::mutex> lock(lib.mu);
  lib.init_count = 0;
  lib.finalized = true;
  return PSM2_OK;
}

const char* psm2_error_get_string(psm2_error_t error) {
  switch (error) {
    case PSM2_OK:
      return "Success";
    case PSM2_OK_NO_PROGRESS:
      return "No events progressed";
    case PSM2_PARAM_ERR:
      return "Error in a function parameter";
    case PSM2_NO_MEMORY:
      return "Insufficient memory";
    case PSM2_INIT_NOT_INIT:
      return "PSM2 has not been initialized";
    case PSM2_INIT_BAD_API_VERSION:
      return "Incompatible PSM2 API version";
    case PSM2_NO_AFFINITY:
      return "No affinity available";
    case PSM2_INTERNAL_ERR:
      return "Unknown internal error";
    case PSM2_SHMEM_SEGMENT_ERR:
      return "Shared memory segment error";
    case PSM2_OPT_READONLY:
      return "Option is read-only";
    case PSM2_TIMEOUT:
      return "Operation timed out";
    case PSM2_TOO_MANY_ENDPOINTS:
      return "Exceeded supported amount of endpoints";
    case PSM2_IS_FINALIZED:
      return "PSM2 is finalized";
    case PSM2_EP_WAS_CLOSED:
      return "Endpoint was closed";
    case PSM2_EP_NO_DEVICE:
      return "No device (psmd) available";
    case PSM2_EP_UNIT_NOT_FOUND:
      return "Specified unit was not found";
    case PSM2_EP_DEVICE_FAILURE:
      return "Device failure";
    case PSM2_EP_CLOSE_TIMEOUT:
      return "Endpoint close timed out";
    case PSM2_EP_NO_PORTS_AVAIL:
      return "No free ports could be obtained";
    case PSM2_EP_NO_NETWORK:
      return "Network is down";
    case PSM2_EP_INVALID_UUID_KEY:
      return "Invalid job key";
    case PSM2_EP_NO_RESOURCES:
      return "No resources available";
    case PSM2_EPID_UNKNOWN:
      return "Unknown endpoint id";
    case PSM2_EPID_UNREACHABLE:
      return "Endpoint id is unreachable";
    case PSM2_EPID_INVALID_NODE:
      return "Invalid node in endpoint id";
    case PSM2_EPID_INVALID_MTU:
      return "Invalid MTU";
    case PSM2_EPID_INVALID_UUID_KEY:
      return "Remote endpoint belongs to another job (uuid key)";
    case PSM2_EPID_INVALID_VERSION:
      return "Remote endpoint runs an incompatible version";
    case PSM2_EPID_INVALID_CONNECT:
      return "Invalid connection request";
    case PSM2_EPID_ALREADY_CONNECTED:
      return "Endpoint is already connected";
    case PSM2_EPID_NETWORK_ERROR:
      return "Network error while connecting";
    case PSM2_EPID_INVALID_PKEY:
      return "Invalid partition key";
    case PSM2_EPID_PATH_RESOLUTION:
      return "Path resolution failed";
    case PSM2_MQ_NO_COMPLETIONS:
      return "No completion events available";
    case PSM2_MQ_TRUNCATION:
      return "Message was truncated";
    case PSM2_AM_INVALID_REPLY:
      return "Invalid active message reply";
    case PSM2_IQ_INVALID_QUERY:
      return "Invalid info query";
    default:
      return "Unknown PSM2 error";
  }
}

psm2_error_t psm2_ep_open_opts_get_defaults(struct psm2_ep_open_opts* opts) {
  Library& lib = Library::Get();
  if (psm2_error_t err = lib.RequireInit("psm2_ep_open_opts_get_defaults");
      err != PSM2_OK) {
    return err;
  }
  if (opts == nullptr) {
    return Library::Report(PSM2_PARAM_ERR,
                           "psm2_ep_open_opts_get_defaults: opts is NULL");
  }
  // Intel's defaults, field for field, so that programs that print or
  // compare them see the same. psmd itself uses none of them (see
  // CheckOpenOptions).
  opts->timeout = 30'000'000'000;
  opts->unit = -1;
  opts->affinity = PSM2_EP_OPEN_AFFINITY_SET;
  opts->shm_mbytes = 0;
  opts->sendbufs_num = 1024;
  opts->network_pkey = 0x8001;  // the HFI default partition key
  opts->port = 0;
  opts->outsl = 0;
  opts->service_id = 0x1000117500000000ull;  // the HFI default service id
  opts->path_res_type = PSM2_PATH_RES_NONE;
  opts->senddesc_num = 4096;
  opts->imm_size = 128;
  return PSM2_OK;
}

psm2_error_t psm2_ep_open(const psm2_uuid_t unique_job_key,
                          const struct psm2_ep_open_opts* opts, psm2_ep_t* ep,
                          psm2_epid_t* epid) {
  Library& lib = Library::Get();
  if (psm2_error_t err = lib.RequireInit("psm2_ep_open"); err != PSM2_OK)
    return err;
  if (unique_job_key == nullptr || ep == nullptr || epid == nullptr) {
    return Library::Report(
        PSM2_PARAM_ERR,
        "psm2_ep_open: unique_job_key, ep and epid must not be NULL");
  }
  if (opts != nullptr) {
    if (psm2_error_t err = CheckOpenOptions(*opts); err != PSM2_OK) return err;
  }
  bool allowed;
  {
    std::lock_guard<std::mutex> lock(lib.mu);
    allowed = lib.multi_ep || lib.endpoints.size() + lib.opening == 0;
    if (allowed) lib.opening++;
  }
  if (!allowed) {
    return Library::Report(
        PSM2_TOO_MANY_ENDPOINTS,
        "psm2_ep_open: this process has an endpoint already; set "
        "PSM2_MULTI_EP=1 before psm2_init to open more (Intel's PSM2 has "
        "the same rule)");
  }
  std::unique_ptr<psm2_ep> opened;
  psmd::Status err = psm2_ep::Open(lib.control(), unique_job_key, &opened);
  if (!err.ok()) {
    {
      std::lock_guard<std::mutex> lock(lib.mu);
      lib.opening--;
    }
    return Library::Report(static_cast<psm2_error_t>(err.code), err.message);
  }
  *ep = opened.get();
  *epid = opened->epid();
  psmd::client::IdentifyEndpoint(opened->epid(), opened->daemon_version(),
                                 opened->control()->socket_path());
  lib.AdoptGlobalHandler(opened.get());
  std::lock_guard<std::mutex> lock(lib.mu);
  lib.opening--;
  lib.endpoints.push_back(std::move(opened));
  return PSM2_OK;
}

psm2_error_t psm2_ep_close(psm2_ep_t ep, int mode, int64_t timeout) {
  Library& lib = Library::Get();
  if (psm2_error_t err = lib.RequireInit("psm2_ep_close"); err != PSM2_OK)
    return err;
  if (ep == nullptr)
    return Library::Report(PSM2_PARAM_ERR, "psm2_ep_close: ep is NULL");
  if (mode != PSM2_EP_CLOSE_GRACEFUL && mode != PSM2_EP_CLOSE_FORCE) {
    return Library::Report(
        ep, PSM2_PARAM_ERR,
        "psm2_ep_close: unknown mode " + std::to_string(mode) +
            " (use PSM2_EP_CLOSE_GRACEFUL or PSM2_EP_CLOSE_FORCE)");
  }
  const std::string not_open =
      "psm2_ep_close: the endpoint is not open (closed already, or never "
      "returned by "
      "psm2_ep_open)";
  bool is_open;
  {
    std::lock_guard<std::mutex> lock(lib.mu);
    is_open = lib.IsOpenLocked(ep);
  }
  if (!is_open) return Library::Report(PSM2_EP_WAS_CLOSED, not_open);
  // Graceful: hand psmd everything still owed, so that receivers get the
  // messages already sent. Forced: drop it.
  psm2_error_t result = PSM2_OK;
  if (mode == PSM2_EP_CLOSE_GRACEFUL) {
    if (size_t left = DrainSends(ep, timeout); left > 0) {
      result = Library::Report(ep, PSM2_EP_CLOSE_TIMEOUT,
                               "psm2_ep_close: " + std::to_string(left) +
                                   " sends still unfinished when the close "
                                   "timed out (rendezvous sends wait for "
                                   "their receivers); they are abandoned");
    }
  }
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
    lib.connected.erase(ep);
    for (auto it = lib.labels.begin(); it != lib.labels.end();) {
      it = it->first->ep == ep ? lib.labels.erase(it) : std::next(it);
    }
  }
  lib.ForgetEndpointHandler(ep);
  if (!owned)
    return Library::Report(PSM2_EP_WAS_CLOSED, not_open);  // by another thread
  psmd::Status err;
  bool lost;
  {
    // Looked at now: were psmd replaced, its successor could have given this
    // endpoint's id to an endpoint of a new job, and closing by id would
    // close that one (psmd also refuses our epid, of an earlier psmd).
    psmd::client::EndpointLock lock(&owned->mu);
    lost = owned->CheckDaemon();
  }
  if (!lost) err = owned->control()->CloseEndpoint(owned->id(), owned->epid());
  // Unmapping and closing the fds (the destructor) releases the segments;
  // closing the attach connection tells the daemon in any case.
  owned.reset();
  if (!err.ok())
    return Library::Report(static_cast<psm2_error_t>(err.code), err.message);
  return result;
}

psm2_error_t psm2_ep_connect(psm2_ep_t ep, int num_of_epid,
                             const psm2_epid_t* array_of_epid,
                             const int* array_of_epid_mask,
                             psm2_error_t* array_of_errors,
                             psm2_epaddr_t* array_of_epaddr, int64_t timeout) {
  // psmd answers at once for this node's epids (open or not: nothing to
  // wait for), and within its fabric timeout for other nodes' (it tries
  // their daemons until then), so the caller's timeout does not apply.
  (void)timeout;
  Library& lib = Library::Get();
  if (psm2_error_t err = lib.RequireInit("psm2_ep_connect"); err != PSM2_OK)
    return err;
  if (ep == nullptr || num_of_epid < 1 || array_of_epid == nullptr ||
      array_of_errors == nullptr || array_of_epaddr == nullptr) {
    return Library::Report(
        ep, PSM2_PARAM_ERR,
        "psm2_ep_connect: needs an endpoint, num_of_epid >= 1 and the epid, "
        "error and epaddr arrays");
  }
  bool is_open;
  {
    std::lock_guard<std::mutex> lock(lib.mu);
    is_open = lib.IsOpenLocked(ep);
  }
  if (!is_open) {
    return Library::Report(PSM2_EP_WAS_CLOSED,
                           "psm2_ep_connect: the endpoint is not open");
  }
  bool lost;
  {
    // As in psm2_ep_close: a successor psmd must not connect whichever of
    // its endpoints has our id.
    psmd::client::EndpointLock lock(&ep->mu);
    lost = ep->CheckDaemon();
  }
  if (lost) {
    for (int i = 0; i < num_of_epid; i++) {
      if (array_of_epid_mask == nullptr || array_of_epid_mask[i] != 0)
        array_of_errors[i] = PSM2_EP_WAS_CLOSED;
    }
    return Library::DaemonGone(ep, "psm2_ep_connect");
  }
  std::vector<uint64_t> wanted;
  std::vector<int> index_of;
  for (int i = 0; i < num_of_epid; i++) {
    if (array_of_epid_mask != nullptr && array_of_epid_mask[i] == 0) continue;
    array_of_errors[i] = PSM2_EPID_UNKNOWN;
    array_of_epaddr[i] = nullptr;
    wanted.push_back(array_of_epid[i]);
    index_of.push_back(i);
  }
  psm2_error_t worst = PSM2_OK;
  std::string failures;
  constexpr size_t kFailuresNamed = 8;
  size_t failed = 0;
  if (!wanted.empty()) {
    psmd::v1::ConnectReply reply;
    psmd::Status err = ep->control()->Connect(ep->id(), ep->epid(), wanted,
                                              ep->remote_wait(), &reply);
    if (err.ok() && reply.results_size() != static_cast<int>(wanted.size())) {
      err = {PSM2_INTERNAL_ERR, "psm2_ep_connect: psmd answered " +
                                    std::to_string(reply.results_size()) +
                                    " results for " +
                                    std::to_string(wanted.size()) + " epids"};
    }
    if (!err.ok()) {
      for (int i : index_of)
        array_of_errors[i] = static_cast<psm2_error_t>(err.code);
      return Library::Report(ep, static_cast<psm2_error_t>(err.code),
                             err.message);
    }
    {
      // Names for the messages, where psm2_map_nid_hostname gave none.
      std::lock_guard<std::mutex> lib_lock(lib.mu);
      for (size_t k = 0; k < wanted.size(); k++) {
        const std::string& host = reply.results(static_cast<int>(k)).host();
        if (!host.empty())
          lib.table_hostnames[psmd::shm::NodeIdOf(wanted[k])] = host;
      }
    }
    psmd::client::EndpointLock lock(&ep->mu);
    for (size_t k = 0; k < wanted.size(); k++) {
      const int i = index_of[k];
      const psmd::v1::ConnectResult& r = reply.results(static_cast<int>(k));
      const auto error = static_cast<psm2_error_t>(r.error());
      array_of_errors[i] = error;
      if (error != PSM2_OK) {
        worst = WorseError(worst, error);
        // The first few name their epid; a job of thousands says how many.
        if (++failed <= kFailuresNamed) {
          failures += "; " + lib.Describe(wanted[k]) + ": " + r.message();
        }
        continue;
      }
      psm2_epaddr_t addr = ep->EpaddrFor(wanted[k]);
      addr->slot = r.slot();
      array_of_epaddr[i] = addr;
      std::lock_guard<std::mutex> lib_lock(lib.mu);
      lib.connected[ep][wanted[k]] = addr;
    }
  }
  if (worst == PSM2_OK) {
    // As Intel's: on success every entry reads PSM2_OK, masked ones too.
    for (int i = 0; i < num_of_epid; i++) array_of_errors[i] = PSM2_OK;
    return PSM2_OK;
  }
  return Library::Report(
      ep, worst,
      "psm2_ep_connect: " + std::to_string(failed) +
          " endpoints could not be connected (see array_of_errors)" + failures +
          (failed > kFailuresNamed
               ? "; and " + std::to_string(failed - kFailuresNamed) + " more"
               : ""));
}

psm2_error_t psm2_ep_disconnect2(psm2_ep_t ep, int num_of_epaddr,
                                 psm2_epaddr_t* array_of_epaddr,
                                 const int* array_of_epaddr_mask,
                                 psm2_error_t* array_of_errors, int mode,
                                 int64_t timeout) {
  // A psmd connection is this library's permission to address a peer, kept
  // by psmd under a slot number. Disconnecting withdraws the permission at
  // once: new sends and receives naming the peer are refused, while
  // operations already posted complete (psmd keeps the slot, and a
  // reconnect reuses it). Nothing is waited for, in either mode.
  (void)timeout;
  Library& lib = Library::Get();
  if (psm2_error_t err = lib.RequireInit("psm2_ep_disconnect"); err != PSM2_OK)
    return err;
  if (ep == nullptr || num_of_epaddr < 1 || array_of_epaddr == nullptr ||
      array_of_errors == nullptr) {
    return Library::Report(
        ep, PSM2_PARAM_ERR,
        "psm2_ep_disconnect: needs an endpoint, num_of_epaddr >= 1 and the "
        "epaddr and error arrays");
  }
  if (mode != PSM2_EP_DISCONNECT_GRACEFUL && mode != PSM2_EP_DISCONNECT_FORCE) {
    return Library::Report(
        ep, PSM2_PARAM_ERR,
        "psm2_ep_disconnect2: unknown mode " + std::to_string(mode) +
            " (use PSM2_EP_DISCONNECT_GRACEFUL or PSM2_EP_DISCONNECT_FORCE)");
  }
  {
    std::lock_guard<std::mutex> lock(lib.mu);
    if (!lib.IsOpenLocked(ep)) {
      return Library::Report(PSM2_EP_WAS_CLOSED,
                             "psm2_ep_disconnect: the endpoint is not open");
    }
  }
  // The same epaddr twice gets the first one's result, as with Intel's.
  std::unordered_map<psm2_epaddr_t, psm2_error_t> done;
  psmd::client::EndpointLock lock(&ep->mu);
  for (int i = 0; i < num_of_epaddr; i++) {
    if (array_of_epaddr_mask != nullptr && array_of_epaddr_mask[i] == 0)
      continue;
    psm2_epaddr_t addr = array_of_epaddr[i];
    auto seen = done.find(addr);
    if (seen != done.end()) {
      array_of_errors[i] = seen->second;
    } else if (addr == nullptr || addr->ep != ep ||
               addr->slot == psmd::client::kNoSlot) {
      array_of_errors[i] =
          PSM2_EPID_UNKNOWN;  // not connected from this endpoint
    } else {
      addr->slot = psmd::client::kNoSlot;
      array_of_errors[i] = PSM2_OK;
    }
    done.emplace(addr, array_of_errors[i]);
    if (array_of_errors[i] == PSM2_OK) array_of_epaddr[i] = nullptr;
  }
  // As Intel's: per-peer errors are in the array; the call itself succeeds.
  return PSM2_OK;
}

psm2_error_t psm2_ep_disconnect(psm2_ep_t ep, int num_of_epaddr,
                                psm2_epaddr_t* array_of_epaddr,
                                const int* array_of_epaddr_mask,
                                psm2_error_t* array_of_errors,
                                int64_t timeout) {
  return psm2_ep_disconnect2(ep, num_of_epaddr, array_of_epaddr,
                             array_of_epaddr_mask, array_of_errors,
                             PSM2_EP_DISCONNECT_GRACEFUL, timeout);
}

psm2_error_t psm2_poll(psm2_ep_t ep) {
  if (ep == nullptr) return Library::BadArgument("psm2_poll", "ep is null");
  psmd::client::EndpointLock lock(&ep->mu);
  const bool did = ep->Progress();
  // Reported through the error handler when reaped, wherever that was; an
  // application without a handler learns it here.
  if (psm2_error_t lost = ep->TakeNodeLost(); lost != PSM2_OK) return lost;
  if (did) return PSM2_OK;
  ep->IdleYield();
  return PSM2_OK_NO_PROGRESS;
}

}  // extern "C"
