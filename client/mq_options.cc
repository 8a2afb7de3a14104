#include "client/mq_options.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "client/endpoint.h"
#include "client/library.h"

namespace psmd::client {
namespace {

psm2_error_t SetBudget(psm2_mq_t mq, uint64_t mbytes) {
  psm2_ep_t ep = mq->ep;
  uint64_t bytes = mbytes << 20;
  if (mbytes == 0 || bytes > ep->max_unexpected_budget()) {
    return Library::Report(
        PSM2_PARAM_ERR, "PSM2_MQ_MAX_SYSBUF_MBYTES " + std::to_string(mbytes) +
                            " is outside 1.." +
                            std::to_string(ep->max_unexpected_budget() >> 20) +
                            " (psmd --max-unexpected-mib)");
  }
  psmd::client::EndpointLock lock(&ep->mu);
  if (ep->daemon_lost()) {
    lock.Unlock();
    return Library::DaemonGone(ep, "psm2_mq_setopt");
  }
  psm2_mq_req* r = ep->NewRequest(psm2_mq_req::Kind::kInternal, nullptr);
  psm2_error_t err = ep->RoundTrip(
      r, shm::PrepSetOption(TokenOf(r),
                            shm::QueueOption::kUnexpectedBudgetBytes, bytes));
  ep->FreeRequest(r);
  if (err == PSM2_OK) mq->max_sysbuf_mbytes = static_cast<uint32_t>(mbytes);
  return err;
}

}  // namespace

psm2_error_t InitMqOptions(psm2_mq_t mq) {
  mq->rndv_shm_bytes = kDefaultRndvBytes;
  mq->rndv_hfi_bytes = kDefaultRndvBytes;
  const char* in_place = getenv("PSMD_COPY_IN_PLACE");
  mq->copy_in_place = in_place == nullptr || strcmp(in_place, "off") != 0;
  const struct {
    const char* var;
    int option;
  } env_options[] = {
      {"PSM2_MQ_RNDV_SHM_THRESH", PSM2_MQ_RNDV_SHM_SZ},
      {"PSM2_MQ_RNDV_HFI_THRESH", PSM2_MQ_RNDV_HFI_SZ},
      {"PSM2_MQ_MAX_SYSBUF_MBYTES", PSM2_MQ_MAX_SYSBUF_MBYTES},
  };
  for (const auto& e : env_options) {
    const char* text = getenv(e.var);
    if (text == nullptr || *text == '\0') continue;
    char* end = nullptr;
    unsigned long long v = strtoull(text, &end, 0);
    if (*end != '\0' || v > UINT32_MAX) {
      return Library::Report(PSM2_PARAM_ERR,
                             std::string(e.var) + "='" + text +
                                 "' is not a number from 0 to 4294967295");
    }
    psm2_error_t err = SetMqOption(mq, e.option, v);
    if (err != PSM2_OK) return err;
  }
  return PSM2_OK;
}

psm2_error_t GetMqOption(psm2_mq_t mq, int option, uint32_t* value) {
  psmd::client::EndpointLock lock(&mq->ep->mu);
  switch (option) {
    case PSM2_MQ_RNDV_SHM_SZ:
      *value = mq->rndv_shm_bytes;
      return PSM2_OK;
    case PSM2_MQ_RNDV_HFI_SZ:
      *value = mq->rndv_hfi_bytes;
      return PSM2_OK;
    case PSM2_MQ_MAX_SYSBUF_MBYTES:
      *value = mq->max_sysbuf_mbytes;
      return PSM2_OK;
  }
  return Library::Report(PSM2_PARAM_ERR,
                         "unknown MQ option " + std::to_string(option));
}

psm2_error_t SetMqOption(psm2_mq_t mq, int option, uint64_t value) {
  if (value > UINT32_MAX) {
    return Library::BadArgument("psm2_mq_setopt",
                                "value " + std::to_string(value) +
                                    " does not fit the option's 32 bits");
  }
  switch (option) {
    case PSM2_MQ_RNDV_SHM_SZ: {
      psmd::client::EndpointLock lock(&mq->ep->mu);
      mq->rndv_shm_bytes = static_cast<uint32_t>(value);
      return PSM2_OK;
    }
    case PSM2_MQ_RNDV_HFI_SZ: {
      psmd::client::EndpointLock lock(&mq->ep->mu);
      mq->rndv_hfi_bytes = static_cast<uint32_t>(value);
      return PSM2_OK;
    }
    case PSM2_MQ_MAX_SYSBUF_MBYTES:
      return SetBudget(mq, value);
  }
  return Library::Report(PSM2_PARAM_ERR,
                         "unknown MQ option " + std::to_string(option));
}

}  // namespace psmd::client
