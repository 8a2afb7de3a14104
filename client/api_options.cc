// psm2.h: psm2_getopt / psm2_setopt, dispatching on the component.
//
// CORE: PSM2_CORE_OPT_DEBUG (the debug mask; its bit 0x1, on by default,
// prints error reports on stderr) and PSM2_CORE_OPT_EP_CTXT (an epaddr's
// user context). AM: the read-only active-message limits. IB: nothing, psmd
// has no fabric. MQ: see mq_options.h.
#include <psm2.h>
#include <psm2_mq.h>

#include <cstdio>
#include <mutex>
#include <string>

#include "client/endpoint.h"
#include "client/library.h"
#include "client/mq_options.h"
#include "shm/descriptor.h"

using psmd::client::Library;

namespace {

std::string OptionName(int optname) {
  char hex[16];
  snprintf(hex, sizeof(hex), "%#x", optname);
  return hex;
}

// A getopt buffer smaller than the option: *optlen tells the size needed.
psm2_error_t TooSmall(const char* component, int optname, uint64_t* optlen,
                      uint64_t needed) {
  const uint64_t given = *optlen;
  *optlen = needed;
  return Library::Report(
      PSM2_PARAM_ERR, std::string("psm2_getopt: ") + component + " option " +
                          OptionName(optname) + " needs " +
                          std::to_string(needed) + " bytes, the buffer has " +
                          std::to_string(given));
}

psm2_error_t CoreSetopt(const void* obj, int optname, const void* optval,
                        uint64_t optlen) {
  switch (optname) {
    case PSM2_CORE_OPT_DEBUG:
      if (optval == nullptr || optlen < sizeof(uint32_t)) break;
      Library::Get().debug_mask.store(*static_cast<const uint32_t*>(optval));
      return PSM2_OK;
    case PSM2_CORE_OPT_EP_CTXT: {
      // As Intel's (and psm2_epaddr_setctxt): the context is the pointer
      // optval itself, not what it points to.
      if (obj == nullptr || optlen < sizeof(void*)) break;
      auto* epaddr = static_cast<psm2_epaddr_t>(const_cast<void*>(obj));
      psmd::client::EndpointLock lock(&epaddr->ep->mu);
      epaddr->ctxt = const_cast<void*>(optval);
      return PSM2_OK;
    }
    default:
      return Library::Report(
          PSM2_PARAM_ERR, "psm2_setopt: unknown PSM2_COMPONENT_CORE option " +
                              OptionName(optname));
  }
  return Library::Report(
      PSM2_PARAM_ERR,
      "psm2_setopt: PSM2_COMPONENT_CORE option " + OptionName(optname) +
          " needs a value of " +
          (optname == PSM2_CORE_OPT_DEBUG ? "4 bytes (uint32_t)"
                                          : "pointer size and an epaddr"));
}

psm2_error_t CoreGetopt(const void* obj, int optname, void* optval,
                        uint64_t* optlen) {
  switch (optname) {
    case PSM2_CORE_OPT_DEBUG:
      if (*optlen < sizeof(uint32_t))
        return TooSmall("CORE", optname, optlen, sizeof(uint32_t));
      *static_cast<uint32_t*>(optval) = Library::Get().debug_mask.load();
      return PSM2_OK;
    case PSM2_CORE_OPT_EP_CTXT: {
      if (obj == nullptr) {
        return Library::Report(
            PSM2_PARAM_ERR,
            "psm2_getopt: PSM2_CORE_OPT_EP_CTXT needs an epaddr");
      }
      if (*optlen < sizeof(void*))
        return TooSmall("CORE", optname, optlen, sizeof(void*));
      auto* epaddr = static_cast<psm2_epaddr_t>(const_cast<void*>(obj));
      psmd::client::EndpointLock lock(&epaddr->ep->mu);
      *static_cast<void**>(optval) = epaddr->ctxt;
      return PSM2_OK;
    }
    default:
      return Library::Report(
          PSM2_PARAM_ERR, "psm2_getopt: unknown PSM2_COMPONENT_CORE option " +
                              OptionName(optname));
  }
}

psm2_error_t AmGetopt(int optname, void* optval, uint64_t* optlen) {
  uint32_t value;
  switch (optname) {
    case PSM2_AM_OPT_FRAG_SZ:
      value = psmd::shm::kAmMaxPayload;
      break;
    case PSM2_AM_OPT_NARGS:
      value = psmd::shm::kAmMaxArgs;
      break;
    case PSM2_AM_OPT_HANDLERS:
      value = psmd::shm::kAmMaxHandlers;
      break;
    default:
      return Library::Report(PSM2_PARAM_ERR,
                             "psm2_getopt: unknown PSM2_COMPONENT_AM option " +
                                 OptionName(optname));
  }
  if (*optlen < sizeof(uint32_t))
    return TooSmall("AM", optname, optlen, sizeof(uint32_t));
  *static_cast<uint32_t*>(optval) = value;
  return PSM2_OK;
}

psm2_error_t IbOption(const char* function, int optname) {
  return Library::Report(
      PSM2_PARAM_ERR,
      std::string(function) + ": PSM2_COMPONENT_IB option " +
          OptionName(optname) +
          " does not exist on psmd: it has no fabric, every peer is on this "
          "node and reached through shared memory");
}

}  // namespace

extern "C" {

psm2_error_t psm2_setopt(psm2_component_t component, const void* component_obj,
                         int optname, const void* optval, uint64_t optlen) {
  switch (component) {
    case PSM2_COMPONENT_CORE:
      return CoreSetopt(component_obj, optname, optval, optlen);
    case PSM2_COMPONENT_MQ: {
      if (component_obj == nullptr || optval == nullptr ||
          optlen < sizeof(uint32_t)) {
        return Library::BadArgument(
            "psm2_setopt",
            "PSM2_COMPONENT_MQ takes the mq and a uint32_t value (not null, "
            "optlen at least 4)");
      }
      auto* mq = static_cast<psm2_mq_t>(const_cast<void*>(component_obj));
      return psmd::client::SetMqOption(mq, optname,
                                       *static_cast<const uint32_t*>(optval));
    }
    case PSM2_COMPONENT_AM:
      // Whatever the option: all AM options are limits of the implementation.
      return Library::Report(
          PSM2_OPT_READONLY,
          "psm2_setopt: PSM2_COMPONENT_AM option " + OptionName(optname) +
              " is read-only (psm2_getopt or psm2_am_get_parameters tell "
              "the limits)");
    case PSM2_COMPONENT_IB:
      return IbOption("psm2_setopt", optname);
  }
  return Library::Report(PSM2_PARAM_ERR,
                         "psm2_setopt: unknown component " +
                             std::to_string(static_cast<int>(component)));
}

psm2_error_t psm2_getopt(psm2_component_t component, const void* component_obj,
                         int optname, void* optval, uint64_t* optlen) {
  if (component == PSM2_COMPONENT_MQ) {
    if (component_obj == nullptr || optval == nullptr || optlen == nullptr) {
      return Library::BadArgument(
          "psm2_getopt", "PSM2_COMPONENT_MQ takes the mq, optval and optlen");
    }
    if (*optlen < sizeof(uint32_t)) {
      // Not a failure to report: the caller learns the size it needs.
      *optlen = sizeof(uint32_t);
      return PSM2_NO_MEMORY;
    }
    auto* mq = static_cast<psm2_mq_t>(const_cast<void*>(component_obj));
    psm2_error_t err =
        psmd::client::GetMqOption(mq, optname, static_cast<uint32_t*>(optval));
    if (err == PSM2_OK) *optlen = sizeof(uint32_t);
    return err;
  }
  if (optval == nullptr || optlen == nullptr) {
    return Library::Report(PSM2_PARAM_ERR,
                           "psm2_getopt: optval and optlen must not be NULL");
  }
  switch (component) {
    case PSM2_COMPONENT_CORE:
      return CoreGetopt(component_obj, optname, optval, optlen);
    case PSM2_COMPONENT_AM:
      // The object (an epaddr, or NULL) does not matter: the limits are the
      // same for every peer.
      return AmGetopt(optname, optval, optlen);
    case PSM2_COMPONENT_IB:
      return IbOption("psm2_getopt", optname);
    case PSM2_COMPONENT_MQ:
      break;  // handled above
  }
  return Library::Report(PSM2_PARAM_ERR,
                         "psm2_getopt: unknown component " +
                             std::to_string(static_cast<int>(component)));
}

}  // extern "C"
