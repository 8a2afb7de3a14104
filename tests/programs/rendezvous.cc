#include "tests/programs/rendezvous.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

namespace psmd::testing {

bool PublishEpid(const std::string& dir, int rank, psm2_epid_t epid) {
  std::string path = dir + "/rank" + std::to_string(rank) + ".epid";
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << epid << "\n";
    if (!out) return false;
  }
  return rename(tmp.c_str(), path.c_str()) == 0;
}

bool AwaitEpid(const std::string& dir, int rank, double timeout_s,
               psm2_epid_t* epid) {
  std::string path = dir + "/rank" + std::to_string(rank) + ".epid";
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(path);
    unsigned long long v = 0;
    if (in >> v) {
      *epid = v;
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

bool ParseUuid(const std::string& text, psm2_uuid_t out) {
  std::string hex;
  for (char c : text) {
    if (c != '-') hex += c;
  }
  if (hex.size() != 32) return false;
  for (int i = 0; i < 16; i++) {
    char byte[3] = {hex[2 * i], hex[2 * i + 1], 0};
    char* end = nullptr;
    out[i] = static_cast<uint8_t>(strtoul(byte, &end, 16));
    if (*end != '\0') return false;
  }
  return true;
}

psm2_mq_tag_t TagOf(uint32_t t) {
  psm2_mq_tag_t tag;
  memset(&tag, 0, sizeof(tag));
  tag.tag0 = t;
  return tag;
}

psm2_mq_tag_t ExactSelector() {
  psm2_mq_tag_t sel;
  memset(&sel, 0xff, sizeof(sel));
  return sel;
}

void CheckPsm(psm2_error_t err, const char* what) {
  if (err != PSM2_OK) {
    fprintf(stderr, "%s: %s\n", what, psm2_error_get_string(err));
    exit(2);
  }
}

void InitAndOpen(const psm2_uuid_t uuid, psm2_ep_t* ep, psm2_epid_t* epid) {
  int major = PSM2_VERNO_MAJOR, minor = PSM2_VERNO_MINOR;
  CheckPsm(psm2_init(&major, &minor), "psm2_init");
  CheckPsm(psm2_ep_open(uuid, nullptr, ep, epid), "psm2_ep_open");
}

psm2_mq_t InitOpenWithMq(const psm2_uuid_t uuid, psm2_ep_t* ep,
                         psm2_epid_t* epid) {
  InitAndOpen(uuid, ep, epid);
  psm2_mq_t mq;
  CheckPsm(psm2_mq_init(*ep, PSM2_MQ_ORDERMASK_ALL, nullptr, 0, &mq),
           "psm2_mq_init");
  return mq;
}

ConnectedPair OpenAndConnect(const psm2_uuid_t uuid, const std::string& dir,
                             int rank) {
  ConnectedPair c;
  c.mq = InitOpenWithMq(uuid, &c.ep, &c.self_epid);
  if (!PublishEpid(dir, rank, c.self_epid) ||
      !AwaitEpid(dir, 1 - rank, 60, &c.peer_epid)) {
    fprintf(stderr, "rank %d: epid exchange through %s failed\n", rank,
            dir.c_str());
    exit(2);
  }
  psm2_error_t conn_err = PSM2_OK;
  CheckPsm(psm2_ep_connect(c.ep, 1, &c.peer_epid, nullptr, &conn_err, &c.peer,
                           30'000'000'000LL),
           "psm2_ep_connect");
  return c;
}

}  // namespace psmd::testing
