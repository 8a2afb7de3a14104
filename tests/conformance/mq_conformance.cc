// Matched-queue conformance cases (psm2_mq.h), run on Intel's libpsm2 and on
// psmd by run_pair.sh. The cases live in mq_cases_*.cc (conventions in
// mq_cases_util.h); this file holds the first, smallest one and the order.
#include <cstring>
#include <utility>
#include <vector>

#include "tests/conformance/mq_cases_util.h"
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
    CONF_CHECK_OK(psm2_mq_irecv2(p.mq, PSM2_MQ_ANY_ADDR, &tag, &sel, 0, buf,
                                 sizeof(buf), nullptr, &req));
    CONF_CHECK_OK(psm2_mq_wait2(&req, &st));
    CONF_CHECK_EQ(st.msg_length, 6u);
    CONF_CHECK(strcmp(buf, "hello") == 0);
  }
}

}  // namespace
}  // namespace psmd::conformance

int main(int argc, char** argv) {
  using namespace psmd::conformance;
  std::vector<Case> cases = {{"eager_round_trip", mq::Checked(EagerRoundTrip)}};
  for (auto list : {mq::MatchingCases, mq::DeliveryCases, mq::CompletionCases,
                    mq::RendezvousCases}) {
    for (Case& c : list()) cases.push_back(std::move(c));
  }
  return RunCases(argc, argv, cases);
}
