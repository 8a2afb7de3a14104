// Matched-queue conformance cases (psm2_mq.h), run on Intel's libpsm2 and on
// psmd by run_pair.sh.
#include <cstring>
#include <vector>

#include "tests/conformance/pair.h"

namespace psmd::conformance {
namespace {

void EagerRoundTrip(Pair& p) {
  char buf[64] = {};
  psm2_mq_tag_t tag = {};
  tag.tag0 = 7;
  psm2_mq_status2_t st = {};
  if (p.rank == 0) {
    strcpy(buf, "hello");
    CONF_CHECK_OK(psm2_mq_send2(p.mq, p.peer, 0, &tag, buf, 6));
  } else {
    psm2_mq_tag_t sel;
    memset(&sel, 0xff, sizeof(sel));
    psm2_mq_req_t req;
    CONF_CHECK_OK(psm2_mq_irecv2(p.mq, PSM2_MQ_ANY_ADDR, &tag, &sel, 0, buf, sizeof(buf),
                                 nullptr, &req));
    CONF_CHECK_OK(psm2_mq_wait2(&req, &st));
    CONF_CHECK_EQ(st.msg_length, 6u);
    CONF_CHECK(strcmp(buf, "hello") == 0);
  }
}

}  // namespace
}  // namespace psmd::conformance

int main(int argc, char** argv) {
  using namespace psmd::conformance;
  return RunCases(argc, argv, {
      {"eager_round_trip", EagerRoundTrip},
  });
}
