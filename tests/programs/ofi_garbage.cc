// ofi_garbage: a hostile party on an ofi fabric. It opens a plain libfabric
// FI_EP_RDM endpoint with the daemons' provider (no psmd code but the
// message format, hw/ofi/ofi_wire.h), inserts a daemon's listen address
// and sends it what psmd must drop: random bytes of many lengths, one
// message longer than any of psmd's buffers, prefixes broken one field at
// a time, and well-formed non-contact messages. Then it makes contact
// properly (its own address), and once the daemon's accept names its data
// endpoint, sends that endpoint the same garbage plus messages with the
// right key but another sender key, and finally stream bytes with the
// right keys that are no frame at all.
//
//   ofi_garbage --provider PROV --source HOST --target HOST:PORT [--seed N]
//
// Then messages longer than the daemon's buffers, and a second proper
// contact (the listen endpoint must still answer).
//
// Prints "garbage N accepted A": N messages before the long ones, which
// psmd must all count as dropped, and A accepts of the two contacts; exits
// 0 when every message was handed to the provider, 1 otherwise.
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hw/ofi/ofi_wire.h"

namespace ofi = psmd::hw::ofi;

namespace {

struct Raw {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_cq* cq = nullptr;
  fid_av* av = nullptr;
  fid_ep* ep = nullptr;
  fid_mr* mr = nullptr;
  // One registration: what is sent from [0, kRx), the one receive posted
  // into [kRx, 2 * kRx).
  static constexpr size_t kRx = 64 << 10;
  std::vector<uint8_t> buf = std::vector<uint8_t>(2 * kRx);
  fi_context2 rx_ctx{};
  // The posted receive's completion, when one came (Take resets it).
  bool received = false;
  size_t received_len = 0;
  int sent = 0;
  int failed = 0;

  ~Raw() {
    if (ep) fi_close(&ep->fid);
    if (mr) fi_close(&mr->fid);
    if (av) fi_close(&av->fid);
    if (cq) fi_close(&cq->fid);
    if (domain) fi_close(&domain->fid);
    if (fabric) fi_close(&fabric->fid);
    if (info) fi_freeinfo(info);
  }

  bool Open(const std::string& provider, const std::string& source) {
    fi_info* hints = fi_allocinfo();
    hints->caps = FI_MSG;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY;
    hints->addr_format = FI_SOCKADDR_IN;
    hints->fabric_attr->prov_name = strdup(provider.c_str());
    int rc = fi_getinfo(FI_VERSION(1, 17), source.c_str(), "0", FI_SOURCE,
                        hints, &info);
    fi_freeinfo(hints);
    if (rc != 0) return Fail("fi_getinfo", rc);
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_MSG;
    fi_av_attr av_attr{};
    av_attr.type = info->domain_attr->av_type;
    if ((rc = fi_fabric(info->fabric_attr, &fabric, nullptr)) != 0 ||
        (rc = fi_domain(fabric, info, &domain, nullptr)) != 0 ||
        (rc = fi_cq_open(domain, &cq_attr, &cq, nullptr)) != 0 ||
        (rc = fi_av_open(domain, &av_attr, &av, nullptr)) != 0 ||
        (rc = fi_endpoint(domain, info, &ep, nullptr)) != 0 ||
        (rc = fi_ep_bind(ep, &av->fid, 0)) != 0 ||
        (rc = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV)) != 0 ||
        (rc = fi_enable(ep)) != 0 ||
        (rc = fi_mr_reg(domain, buf.data(), buf.size(), FI_SEND | FI_RECV, 0, 0,
                        0, &mr, nullptr)) != 0) {
      return Fail("opening the endpoint", rc);
    }
    return true;
  }

  // Posts the one receive.
  int Receive() {
    return static_cast<int>(fi_recv(ep, buf.data() + kRx, kRx, fi_mr_desc(mr),
                                    FI_ADDR_UNSPEC, &rx_ctx));
  }

  bool Fail(const char* what, int rc) {
    fprintf(stderr, "ofi_garbage: %s: %s\n", what, fi_strerror(-rc));
    return false;
  }

  // Reads one completion, if any: the receive's is kept (received), a
  // send's context returned.
  void* Read() {
    fi_cq_msg_entry e;
    ssize_t n = fi_cq_read(cq, &e, 1);
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(cq, &err, 0);
      return err.op_context;  // the daemon's provider's say: done too
    }
    if (n != 1) return nullptr;
    if (e.op_context == &rx_ctx) {
      received = true;
      received_len = e.len;
    }
    return e.op_context;
  }

  // Progress for a while (the provider moves only when its queue is read).
  void Progress(int ms) {
    const auto end =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < end) {
      Read();
      usleep(1000);
    }
  }

  // One message of `bytes` to `to`, waiting for its completion (so buf can
  // be reused).
  void Send(fi_addr_t to, const std::string& bytes) {
    if (bytes.size() > kRx) std::abort();
    memcpy(buf.data(), bytes.data(), bytes.size());
    fi_context2 ctx{};
    ssize_t rc;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while ((rc = fi_send(ep, buf.data(), bytes.size(), fi_mr_desc(mr), to,
                         &ctx)) == -FI_EAGAIN &&
           std::chrono::steady_clock::now() < end) {
      Progress(1);
    }
    if (rc != 0) {
      failed++;
      return;
    }
    while (std::chrono::steady_clock::now() < end && Read() != &ctx) {
    }
    sent++;
  }
};

std::string Prefix(uint8_t kind, uint64_t dst, uint64_t src, uint64_t seq) {
  ofi::Prefix m;
  m.kind = kind;
  m.dst = dst;
  m.src = src;
  m.seq = seq;
  std::string p(ofi::kPrefix, '\0');
  ofi::EncodePrefix(m, reinterpret_cast<uint8_t*>(p.data()));
  return p;
}

// What psmd must drop whatever the receiving endpoint: random bytes of
// every length up to `max_len` (what the endpoint's buffers hold: longer
// ones go last, see main), and prefixes broken one field at a time. `dst`
// and `src` are keys to put in the well-formed parts.
void SendGarbage(Raw& raw, fi_addr_t to, std::mt19937_64& rng, size_t max_len,
                 uint64_t dst, uint64_t src) {
  for (size_t len : {1, 7, 31, 32, 33, 100, 288, 1000, 4000, 16000}) {
    if (len > max_len) break;
    std::string junk(len, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    raw.Send(to, junk);
  }
  const std::string good = Prefix(ofi::kStream, dst, src, 0) + "payload";
  for (int field : {0, 4, 5, 6, 7}) {  // magic, kind, version, padding
    std::string bad = good;
    bad[field] = static_cast<char>(bad[field] ^ 0x5a);
    raw.Send(to, bad);
  }
  raw.Send(to, Prefix(9, dst, src, 0));                    // no such kind
  raw.Send(to, Prefix(ofi::kCredit, dst, 0, 0));           // no sender key
  raw.Send(to, Prefix(ofi::kStream, 0, src, 0) + "x");     // no receiver key
  raw.Send(to, Prefix(ofi::kContact, dst, src, 0) + "x");  // a keyed contact
}

// Makes contact as `key` from our address `name`: the daemon's key and data
// endpoint's address once its accept came (within 5 s), else false.
bool Contact(Raw& raw, fi_addr_t listen, const std::string& name, uint64_t key,
             uint64_t* daemon_key, std::string* data_name) {
  data_name->clear();
  raw.received = false;
  int rc = raw.Receive();
  raw.Send(listen, Prefix(ofi::kContact, 0, key, 0) + name);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (rc == 0 && data_name->empty() &&
         std::chrono::steady_clock::now() < end) {
    if (!raw.received) {
      raw.Read();
      continue;
    }
    raw.received = false;
    const uint8_t* p = raw.buf.data() + Raw::kRx;
    ofi::Prefix m;
    if (ofi::DecodePrefix(p, raw.received_len, &m) && m.dst == key) {
      *daemon_key = m.src;
      if (m.kind == ofi::kAccept) {
        ofi::DecodeAddress(p + ofi::kPrefix, raw.received_len - ofi::kPrefix,
                           data_name);
      }
    }
    rc = raw.Receive();
  }
  return !data_name->empty();
}

}  // namespace
int main(int argc, char** argv) {
  std::string provider, source, target;
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--provider") provider = argv[i + 1];
    if (flag == "--source") source = argv[i + 1];
    if (flag == "--target") target = argv[i + 1];
    if (flag == "--seed") seed = strtoull(argv[i + 1], nullptr, 10);
  }
  const size_t colon = target.rfind(':');
  if (provider.empty() || source.empty() || colon == std::string::npos) {
    fprintf(stderr,
            "usage: ofi_garbage --provider PROV --source HOST --target "
            "HOST:PORT [--seed N]\n");
    return 2;
  }
  Raw raw;
  if (!raw.Open(provider, source)) return 1;
  char name[ofi::kMaxName];
  size_t len = sizeof name;
  int rc = fi_getname(&raw.ep->fid, name, &len);
  if (rc != 0) {
    raw.Fail("fi_getname", rc);
    return 1;
  }
  // The daemon's listen address as its provider names it.
  fi_info* dest = nullptr;
  rc = fi_getinfo(FI_VERSION(1, 17), target.substr(0, colon).c_str(),
                  target.substr(colon + 1).c_str(), 0, raw.info, &dest);
  if (rc != 0 || dest->dest_addr == nullptr) {
    raw.Fail("resolving the target", rc);
    return 1;
  }
  fi_addr_t listen = FI_ADDR_NOTAVAIL;
  rc = fi_av_insert(raw.av, dest->dest_addr, 1, &listen, 0, nullptr);
  fi_freeinfo(dest);
  if (rc != 1) {
    raw.Fail("fi_av_insert", -FI_EINVAL);
    return 1;
  }
  std::mt19937_64 rng(seed);

  // Messages longer than the receiving buffers go last: over tcp;ofi_rxm
  // one between the listen endpoint's buffer and 16 KiB fails the TCP
  // connection under it (the tcp provider's "dynamically provided rbuf is
  // too small"), and what was in flight behind it on that connection is
  // lost: psmd would count fewer than were sent.
  const std::string ours(name, len);
  // At the listen endpoint: garbage, and well-formed messages that are no
  // contact, or a contact without an address.
  SendGarbage(raw, listen, rng, ofi::kPrefix + ofi::kMaxName, 1234, 5678);
  raw.Send(listen, Prefix(ofi::kStream, 1234, 5678, 0) + "x");
  raw.Send(listen, Prefix(ofi::kContact, 0, 5678, 0));
  int accepted = 0;
  uint64_t daemon_key = 0;
  std::string data_name;
  const uint64_t key = rng() | 1;
  fi_addr_t data = FI_ADDR_NOTAVAIL;
  if (Contact(raw, listen, ours, key, &daemon_key, &data_name) &&
      fi_av_insert(raw.av, data_name.data(), 1, &data, 0, nullptr) == 1) {
    accepted++;
    // At the data endpoint: the garbage again, a contact (they go to the
    // listen endpoint only), our connection's key with another sender key,
    // and then stream bytes with both right keys that are no frame.
    SendGarbage(raw, data, rng, 16000, daemon_key, key);
    raw.Send(data, Prefix(ofi::kContact, 0, key, 0) + ours);
    raw.Send(data, Prefix(ofi::kCredit, daemon_key, key + 2, 0));
    std::string junk(200, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    raw.Send(data, Prefix(ofi::kStream, daemon_key, key, 0) + junk);
  }
  // What psmd must have dropped and counted (all but the contact).
  const int garbage = raw.sent - 1;
  // Too long for the data endpoint; for the listen endpoint a contact with
  // a 300-byte address, and random bytes.
  if (data != FI_ADDR_NOTAVAIL) raw.Send(data, std::string(40000, 'g'));
  raw.Send(listen, Prefix(ofi::kContact, 0, 5678, 0) + std::string(300, 'a'));
  for (size_t n : {1000, 16000, 40000}) raw.Send(listen, std::string(n, 'g'));
  raw.Progress(300);
  // And the listen endpoint still takes a proper contact.
  if (Contact(raw, listen, ours, key + 4, &daemon_key, &data_name)) accepted++;
  printf("garbage %d accepted %d\n", garbage, accepted);
  return raw.failed == 0 ? 0 : 1;
}
