// psm2.h: queries and small helpers of libpsmclient: psm2_info_query, units,
// capabilities, uuids, epid fields, endpoint and connection lookups, epaddr
// contexts and labels, node host names.
//
// psmd presents itself as PSM2 "unit" 0 with one port, 1: the unit is
// present when the daemon's socket exists and active when the daemon
// answers. Its "contexts" are psmd's endpoints (--max-endpoints).
#include <psm2.h>
#include <psm2_mq.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>

#include "client/control_client.h"
#include "client/endpoint.h"
#include "client/library.h"

using psmd::client::Library;

// Not declared in psm2.h (nor in Intel's), but exported by Intel's library:
// the capabilities psm2_get_capability_mask reports.
extern "C" {
uint64_t psm2_capabilities_bitset = PSM2_MULTI_EP_CAP | PSM2_LIB_REFCOUNT_CAP;
}

namespace {

// What psm2_info_query reports for a unit or port that does not exist
// (Intel's: the -1 of its device layer, as a uint32_t).
constexpr uint32_t kNoSuchUnit = 0xffffffffu;
constexpr char kUnitName[] = "psmd";
constexpr char kNetworkType[] = "psmd";

// Arguments each query takes (psm2.h, psm2_info_query_t).
constexpr size_t kQueryArgs[PSM2_INFO_QUERY_LAST] = {
    0,  // NUM_UNITS
    0,  // NUM_PORTS
    1,  // UNIT_STATUS (unit)
    2,  // UNIT_PORT_STATUS (unit, port)
    1,  // NUM_FREE_CONTEXTS (unit)
    1,  // NUM_CONTEXTS (unit)
    2,  // CONFIG (mq, epaddr)
    3,  // THRESH (mq, epaddr, mstq)
    3,  // DEVICE_NAME (mq, epaddr, length)
    2,  // MTU (mq, epaddr)
    2,  // LINK_SPEED (mq, epaddr)
    1,  // NETWORK_TYPE (length)
    0,  // FEATURE_MASK
};

// The unit is present when psmd's socket exists (as a device node would).
bool UnitPresent() {
  return access(psmd::client::SocketPath().c_str(), F_OK) == 0;
}

// Asks psmd how many endpoints it serves and may serve.
psm2_error_t DaemonCapacity(uint32_t* in_use, uint32_t* max) {
  psmd::v1::HealthReply health;
  psmd::Status err = Library::Get().control()->Health(&health);
  if (!err.ok()) {
    return Library::Report(static_cast<psm2_error_t>(err.code),
                           "psm2_info_query: " + err.message);
  }
  if (health.max_endpoints() == 0) {
    return Library::Report(
        PSM2_INTERNAL_ERR,
        "psm2_info_query: psmd does not report its endpoint limit (it is "
        "older than this library); upgrade psmd");
  }
  *in_use = health.endpoint_count();
  *max = health.max_endpoints();
  return PSM2_OK;
}

// PSM2_INFO_QUERY_UNIT_STATUS: 1 when psmd answers, 0 when its socket
// exists but nobody answers, kNoSuchUnit for any other unit.
uint32_t UnitStatus(uint32_t unit) {
  if (unit != 0 || !UnitPresent()) return kNoSuchUnit;
  psmd::v1::HealthReply health;
  return Library::Get().control()->Health(&health).ok() ? 1 : 0;
}

// Validates the (mq, epaddr) pair of a per-connection query and tells how
// the connection is carried: to itself, to another endpoint of this node, or
// to one on another node (through psmd's fabric, reported as Intel's reports
// its HFI transport).
psm2_error_t ConnectionConfig(const char* query, psm2_mq_t mq,
                              psm2_epaddr_t epaddr, uint32_t* config) {
  if (mq == nullptr || epaddr == nullptr || epaddr->ep != mq->ep) {
    return Library::Report(
        PSM2_PARAM_ERR,
        std::string("psm2_info_query(") + query +
            "): needs an MQ and an epaddr connected from that MQ's endpoint");
  }
  // A connection to the endpoint's own epid is its loopback, which Intel's
  // reports as SELF.
  if (epaddr->epid == mq->ep->epid()) {
    *config = PSM2_INFO_QUERY_CONFIG_SELF;
  } else if (psmd::shm::NodeIdOf(epaddr->epid) ==
             psmd::shm::NodeIdOf(mq->ep->epid())) {
    *config = PSM2_INFO_QUERY_CONFIG_AMSH;
  } else {
    *config = PSM2_INFO_QUERY_CONFIG_IPS;
  }
  return PSM2_OK;
}

psm2_error_t QueryThreshold(psm2_mq_t mq, psm2_epaddr_t epaddr,
                            enum psm2_info_query_thresh_et which,
                            uint32_t* out) {
  uint32_t config;
  if (psm2_error_t err = ConnectionConfig("THRESH", mq, epaddr, &config);
      err != PSM2_OK) {
    return err;
  }
  // The one threshold of a psmd connection is where rendezvous starts:
  // RNDV_SHM_SZ on this node (loopback too), RNDV_HFI_SZ to another.
  const bool asks_ours = (config == PSM2_INFO_QUERY_CONFIG_AMSH &&
                          which == PSM2_INFO_QUERY_THRESH_AMSH_START) ||
                         (config == PSM2_INFO_QUERY_CONFIG_SELF &&
                          which == PSM2_INFO_QUERY_THRESH_SELF_START) ||
                         (config == PSM2_INFO_QUERY_CONFIG_IPS &&
                          which == PSM2_INFO_QUERY_THRESH_IPS_RNDV);
  if (!asks_ours) {
    return Library::Report(
        PSM2_IQ_INVALID_QUERY,
        "psm2_info_query(THRESH): threshold " + std::to_string(which) +
            " does not apply to this connection; psmd connections have one, "
            "the rendezvous threshold, asked with "
            "PSM2_INFO_QUERY_THRESH_AMSH_START on this node, _IPS_RNDV to "
            "another node, _SELF_START to the endpoint itself");
  }
  psmd::client::EndpointLock lock(&mq->ep->mu);
  *out = config == PSM2_INFO_QUERY_CONFIG_IPS ? mq->rndv_hfi_bytes
                                              : mq->rndv_shm_bytes;
  return PSM2_OK;
}

// Canonical text form of a uuid, lower case, as Intel's psm2_ep_query writes.
void UuidText(const psm2_uuid_t uuid, char* out, size_t size) {
  snprintf(
      out, size,
      "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
      uuid[0], uuid[1], uuid[2], uuid[3], uuid[4], uuid[5], uuid[6], uuid[7],
      uuid[8], uuid[9], uuid[10], uuid[11], uuid[12], uuid[13], uuid[14],
      uuid[15]);
}

}  // namespace

extern "C" {

uint64_t psm2_get_capability_mask(uint64_t req_cap_mask) {
  return psm2_capabilities_bitset & req_cap_mask;
}

void psm2_uuid_generate(psm2_uuid_t uuid_out) {
  if (uuid_out == nullptr) return;
  // A random (version 4) uuid.
  if (getrandom(uuid_out, sizeof(psm2_uuid_t), 0) !=
      static_cast<ssize_t>(sizeof(psm2_uuid_t))) {
    std::random_device rd;
    for (size_t i = 0; i < sizeof(psm2_uuid_t); i++)
      uuid_out[i] = static_cast<uint8_t>(rd());
  }
  uuid_out[6] = static_cast<uint8_t>((uuid_out[6] & 0x0f) | 0x40);
  uuid_out[8] = static_cast<uint8_t>((uuid_out[8] & 0x3f) | 0x80);
}

uint64_t psm2_epid_nid(psm2_epid_t epid) { return psmd::shm::NodeIdOf(epid); }

uint64_t psm2_epid_context(psm2_epid_t epid) {
  return psmd::shm::EndpointIdOf(epid);
}

uint64_t psm2_epid_port(psm2_epid_t epid) { return psm2_epid_context(epid); }

psm2_error_t psm2_ep_num_devunits(uint32_t* num_units) {
  Library& lib = Library::Get();
  if (psm2_error_t err = lib.RequireInit("psm2_ep_num_devunits");
      err != PSM2_OK)
    return err;
  if (num_units == nullptr) {
    return Library::Report(PSM2_PARAM_ERR,
                           "psm2_ep_num_devunits: num_units is NULL");
  }
  *num_units = UnitPresent() ? 1 : 0;
  return PSM2_OK;
}

psm2_error_t psm2_info_query(psm2_info_query_t q, void* out, size_t nargs,
                             psm2_info_query_arg_t args[]) {
  Library& lib = Library::Get();
  if (psm2_error_t err = lib.RequireInit("psm2_info_query"); err != PSM2_OK)
    return err;
  if (q < 0 || q >= PSM2_INFO_QUERY_LAST) {
    return Library::Report(PSM2_IQ_INVALID_QUERY,
                           "psm2_info_query: unknown query " +
                               std::to_string(static_cast<int>(q)));
  }
  if (nargs != kQueryArgs[q] || (nargs > 0 && args == nullptr) ||
      out == nullptr) {
    return Library::Report(
        PSM2_PARAM_ERR,
        "psm2_info_query: query " + std::to_string(static_cast<int>(q)) +
            " takes " + std::to_string(kQueryArgs[q]) + " arguments (given " +
            std::to_string(nargs) + ") and an output buffer");
  }
  auto* out32 = static_cast<uint32_t*>(out);
  switch (q) {
    case PSM2_INFO_QUERY_NUM_UNITS:
      *out32 = UnitPresent() ? 1 : 0;
      return PSM2_OK;
    case PSM2_INFO_QUERY_NUM_PORTS:
      *out32 = 1;
      return PSM2_OK;
    case PSM2_INFO_QUERY_UNIT_STATUS:
      *out32 = UnitStatus(args[0].unit);
      return PSM2_OK;
    case PSM2_INFO_QUERY_UNIT_PORT_STATUS:
      *out32 = args[1].port == 1 ? UnitStatus(args[0].unit) : kNoSuchUnit;
      return PSM2_OK;
    case PSM2_INFO_QUERY_NUM_CONTEXTS:
    case PSM2_INFO_QUERY_NUM_FREE_CONTEXTS: {
      if (args[0].unit != 0) {
        *out32 = kNoSuchUnit;
        return PSM2_OK;
      }
      uint32_t in_use = 0, max = 0;
      if (psm2_error_t err = DaemonCapacity(&in_use, &max); err != PSM2_OK)
        return err;
      *out32 = q == PSM2_INFO_QUERY_NUM_CONTEXTS
                   ? max
                   : (in_use < max ? max - in_use : 0);
      return PSM2_OK;
    }
    case PSM2_INFO_QUERY_CONFIG:
      return ConnectionConfig("CONFIG", args[0].mq, args[1].epaddr, out32);
    case PSM2_INFO_QUERY_THRESH:
      return QueryThreshold(args[0].mq, args[1].epaddr, args[2].mstq, out32);
    case PSM2_INFO_QUERY_DEVICE_NAME: {
      uint32_t config;
      if (psm2_error_t err = ConnectionConfig("DEVICE_NAME", args[0].mq,
                                              args[1].epaddr, &config);
          err != PSM2_OK) {
        return err;
      }
      // "<device>_<unit>", as Intel's ("hfi1_0").
      const size_t length = args[2].length;
      const int n =
          snprintf(static_cast<char*>(out), length, "%s_0", kUnitName);
      if (n < 0 || static_cast<size_t>(n) >= length) {
        return Library::Report(PSM2_INTERNAL_ERR,
                               "psm2_info_query(DEVICE_NAME): the buffer of " +
                                   std::to_string(length) +
                                   " bytes is too small (" +
                                   std::to_string(n + 1) + " needed)");
      }
      return PSM2_OK;
    }
    case PSM2_INFO_QUERY_MTU: {
      uint32_t config;
      if (psm2_error_t err =
              ConnectionConfig("MTU", args[0].mq, args[1].epaddr, &config);
          err != PSM2_OK) {
        return err;
      }
      // No packets, so no MTU: 0, as Intel's reports for shared memory.
      *out32 = 0;
      return PSM2_OK;
    }
    case PSM2_INFO_QUERY_LINK_SPEED: {
      uint32_t config;
      if (psm2_error_t err = ConnectionConfig("LINK_SPEED", args[0].mq,
                                              args[1].epaddr, &config);
          err != PSM2_OK) {
        return err;
      }
      return Library::Report(
          PSM2_IQ_INVALID_QUERY,
          "psm2_info_query(LINK_SPEED): psmd connections have no link "
          "(every peer is on this node, reached through shared memory)");
    }
    case PSM2_INFO_QUERY_NETWORK_TYPE: {
      const size_t length = args[0].length;
      if (length < sizeof(kNetworkType)) {
        return Library::Report(
            PSM2_INTERNAL_ERR,
            "psm2_info_query(NETWORK_TYPE): the buffer of " +
                std::to_string(length) + " bytes is too small (" +
                std::to_string(sizeof(kNetworkType)) + " needed)");
      }
      memcpy(out, kNetworkType, sizeof(kNetworkType));
      return PSM2_OK;
    }
    case PSM2_INFO_QUERY_FEATURE_MASK:
      *out32 = 0;  // no GPU memory support
      return PSM2_OK;
    default:
      return Library::Report(PSM2_IQ_INVALID_QUERY,
                             "psm2_info_query: unknown query " +
                                 std::to_string(static_cast<int>(q)));
  }
}

psm2_error_t psm2_ep_query(int* num_of_epinfo, psm2_epinfo_t* array_of_epinfo) {
  Library& lib = Library::Get();
  if (psm2_error_t err = lib.RequireInit("psm2_ep_query"); err != PSM2_OK)
    return err;
  if (num_of_epinfo == nullptr || *num_of_epinfo <= 0 ||
      array_of_epinfo == nullptr) {
    return Library::Report(
        PSM2_PARAM_ERR,
        "psm2_ep_query: needs an array and its capacity (> 0) in "
        "*num_of_epinfo");
  }
  int n = 0;
  {
    std::lock_guard<std::mutex> lock(lib.mu);
    for (const auto& ep : lib.endpoints) {
      if (n == *num_of_epinfo) break;
      psm2_epinfo_t& info = array_of_epinfo[n++];
      info.ep = ep.get();
      info.epid = ep->epid();
      memcpy(info.uuid, ep->uuid(), sizeof(info.uuid));
      info.jkey = 0;  // no hardware job key (as Intel's without an HFI)
      UuidText(ep->uuid(), info.uuid_str, sizeof(info.uuid_str));
    }
  }
  if (n == 0) {
    return Library::Report(PSM2_EP_WAS_CLOSED,
                           "psm2_ep_query: this process has no open endpoint");
  }
  *num_of_epinfo = n;
  return PSM2_OK;
}

psm2_error_t psm2_ep_epid_lookup(psm2_epid_t epid, psm2_epconn_t* epconn) {
  Library& lib = Library::Get();
  if (psm2_error_t err = lib.RequireInit("psm2_ep_epid_lookup"); err != PSM2_OK)
    return err;
  if (epconn == nullptr) {
    return Library::Report(PSM2_PARAM_ERR,
                           "psm2_ep_epid_lookup: epconn is NULL");
  }
  bool any_open;
  {
    std::lock_guard<std::mutex> lock(lib.mu);
    any_open = !lib.endpoints.empty();
    for (const auto& ep : lib.endpoints) {  // in open order, as Intel's
      auto conns = lib.connected.find(ep.get());
      if (conns == lib.connected.end()) continue;
      auto found = conns->second.find(epid);
      if (found == conns->second.end()) continue;
      epconn->addr = found->second;
      epconn->ep = ep.get();
      epconn->mq = ep->mq_handle();
      return PSM2_OK;
    }
  }
  if (!any_open) {
    return Library::Report(
        PSM2_EP_WAS_CLOSED,
        "psm2_ep_epid_lookup: this process has no open endpoint");
  }
  return Library::Report(PSM2_EPID_UNKNOWN,
                         "psm2_ep_epid_lookup: no endpoint of this process "
                         "has connected to " +
                             lib.Describe(epid));
}

psm2_error_t psm2_ep_epid_lookup2(psm2_ep_t ep, psm2_epid_t epid,
                                  psm2_epconn_t* epconn) {
  Library& lib = Library::Get();
  if (psm2_error_t err = lib.RequireInit("psm2_ep_epid_lookup2");
      err != PSM2_OK)
    return err;
  if (ep == nullptr) {
    return Library::Report(PSM2_EP_WAS_CLOSED,
                           "psm2_ep_epid_lookup2: the endpoint is NULL");
  }
  if (epconn == nullptr) {
    return Library::Report(ep, PSM2_PARAM_ERR,
                           "psm2_ep_epid_lookup2: epconn is NULL");
  }
  {
    std::lock_guard<std::mutex> lock(lib.mu);
    if (lib.IsOpenLocked(ep)) {
      auto conns = lib.connected.find(ep);
      if (conns != lib.connected.end()) {
        auto found = conns->second.find(epid);
        if (found != conns->second.end()) {
          epconn->addr = found->second;
          epconn->ep = ep;
          epconn->mq = ep->mq_handle();
          return PSM2_OK;
        }
      }
    } else {
      ep = nullptr;
    }
  }
  if (ep == nullptr) {
    return Library::Report(PSM2_EP_WAS_CLOSED,
                           "psm2_ep_epid_lookup2: the endpoint is not open");
  }
  return Library::Report(
      ep, PSM2_EPID_UNKNOWN,
      "psm2_ep_epid_lookup2: the endpoint has not connected to " +
          lib.Describe(epid));
}

psm2_error_t psm2_epaddr_to_epid(psm2_epaddr_t epaddr, psm2_epid_t* epid) {
  if (epaddr == nullptr || epid == nullptr) {
    return Library::Report(
        PSM2_PARAM_ERR,
        "psm2_epaddr_to_epid: epaddr and epid must not be NULL");
  }
  *epid = epaddr->epid;
  return PSM2_OK;
}

psm2_error_t psm2_ep_epid_share_memory(psm2_ep_t ep, psm2_epid_t epid,
                                       int* result) {
  Library& lib = Library::Get();
  if (psm2_error_t err = lib.RequireInit("psm2_ep_epid_share_memory");
      err != PSM2_OK) {
    return err;
  }
  if (ep == nullptr || result == nullptr) {
    return Library::Report(
        PSM2_PARAM_ERR,
        "psm2_ep_epid_share_memory: ep and result must not be NULL");
  }
  bool is_open;
  {
    std::lock_guard<std::mutex> lock(lib.mu);
    is_open = lib.IsOpenLocked(ep);
  }
  if (!is_open) {
    return Library::Report(
        PSM2_EP_WAS_CLOSED,
        "psm2_ep_epid_share_memory: the endpoint is not open");
  }
  // Every endpoint of a node is served by that node's psmd, through shared
  // memory; the node id is in the epid.
  *result =
      psmd::shm::NodeIdOf(epid) == psmd::shm::NodeIdOf(ep->epid()) ? 1 : 0;
  return PSM2_OK;
}

psm2_error_t psm2_map_nid_hostname(int num, const uint64_t* nids,
                                   const char** hostnames) {
  Library& lib = Library::Get();
  if (psm2_error_t err = lib.RequireInit("psm2_map_nid_hostname");
      err != PSM2_OK)
    return err;
  if (nids == nullptr || hostnames == nullptr) {
    return Library::Report(
        PSM2_PARAM_ERR,
        "psm2_map_nid_hostname: nids and hostnames must not be NULL");
  }
  std::lock_guard<std::mutex> lock(lib.mu);
  for (int i = 0; i < num; i++) {
    // A NULL name forgets the node's name.
    if (hostnames[i] == nullptr) {
      lib.hostnames.erase(nids[i]);
    } else {
      lib.hostnames[nids[i]] = hostnames[i];
    }
  }
  return PSM2_OK;
}

void psm2_epaddr_setlabel(psm2_epaddr_t epaddr,
                          const char* epaddr_label_string) {
  if (epaddr == nullptr) return;
  Library& lib = Library::Get();
  std::lock_guard<std::mutex> lock(lib.mu);
  if (epaddr_label_string == nullptr) {
    lib.labels.erase(epaddr);
  } else {
    lib.labels[epaddr] = epaddr_label_string;
  }
}

// As Intel's: the context is the PSM2_CORE_OPT_EP_CTXT option.
void psm2_epaddr_setctxt(psm2_epaddr_t epaddr, void* ctxt) {
  psm2_setopt(PSM2_COMPONENT_CORE, epaddr, PSM2_CORE_OPT_EP_CTXT, ctxt,
              sizeof(void*));
}

void* psm2_epaddr_getctxt(psm2_epaddr_t epaddr) {
  void* ctxt = nullptr;
  uint64_t len = sizeof(ctxt);
  if (psm2_getopt(PSM2_COMPONENT_CORE, epaddr, PSM2_CORE_OPT_EP_CTXT, &ctxt,
                  &len) != PSM2_OK) {
    return nullptr;
  }
  return ctxt;
}

}  // extern "C"
