// psm2.h: psm2_getopt / psm2_setopt, dispatching on the component.
#include <psm2.h>
#include <psm2_mq.h>

#include <string>

#include "client/endpoint.h"
#include "client/library.h"
#include "client/mq_options.h"

using psmd::client::Library;

extern "C" {

psm2_error_t psm2_setopt(psm2_component_t component, const void* component_obj, int optname,
                         const void* optval, uint64_t optlen) {
  if (component_obj == nullptr || optval == nullptr) return PSM2_PARAM_ERR;
  switch (component) {
    case PSM2_COMPONENT_MQ: {
      if (optlen < sizeof(uint32_t)) return PSM2_PARAM_ERR;
      auto* mq = static_cast<psm2_mq_t>(const_cast<void*>(component_obj));
      return psmd::client::SetMqOption(mq, optname, *static_cast<const uint32_t*>(optval));
    }
    default:
      return Library::Report(PSM2_PARAM_ERR,
                             "psm2_setopt: component " + std::to_string(component) +
                                 " has no settable option " + std::to_string(optname));
  }
}

psm2_error_t psm2_getopt(psm2_component_t component, const void* component_obj, int optname,
                         void* optval, uint64_t* optlen) {
  if (component_obj == nullptr || optval == nullptr || optlen == nullptr) return PSM2_PARAM_ERR;
  switch (component) {
    case PSM2_COMPONENT_MQ: {
      if (*optlen < sizeof(uint32_t)) {
        *optlen = sizeof(uint32_t);
        return PSM2_NO_MEMORY;
      }
      auto* mq = static_cast<psm2_mq_t>(const_cast<void*>(component_obj));
      psm2_error_t err = psmd::client::GetMqOption(mq, optname, static_cast<uint32_t*>(optval));
      if (err == PSM2_OK) *optlen = sizeof(uint32_t);
      return err;
    }
    default:
      return Library::Report(PSM2_PARAM_ERR,
                             "psm2_getopt: component " + std::to_string(component) +
                                 " has no option " + std::to_string(optname));
  }
}

}  // extern "C"
