#include "hw/fabric.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstdlib>

namespace psmd::hw {
namespace {

bool ValidIp(const std::string& host) {
  in6_addr a6;
  in_addr a4;
  return inet_pton(AF_INET, host.c_str(), &a4) == 1 ||
         inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

bool ParsePort(const std::string& text, uint16_t* port) {
  if (text.empty() || text.size() > 5) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  unsigned long v = std::strtoul(text.c_str(), nullptr, 10);
  if (v > 65535) return false;
  *port = static_cast<uint16_t>(v);
  return true;
}

// Splits "[v6]:rest", "v4:rest", "v6-without-port" or "v4" into host and
// what follows the port colon (empty when there is none).
bool SplitHostPort(const std::string& text, std::string* host,
                   std::string* port, std::string* error) {
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos) {
      *error = "'" + text + "': '[' without ']'";
      return false;
    }
    *host = text.substr(1, close - 1);
    if (close + 1 == text.size()) {
      port->clear();
    } else if (text[close + 1] == ':') {
      *port = text.substr(close + 2);
    } else {
      *error = "'" + text + "': expected ':' after ']'";
      return false;
    }
  } else {
    size_t colon = text.find(':');
    if (colon != std::string::npos && text.find(':', colon + 1) != text.npos) {
      *error = "'" + text + "': write an IPv6 address as [ADDR]:PORT";
      return false;
    }
    *host = text.substr(0, colon);
    *port = colon == std::string::npos ? "" : text.substr(colon + 1);
  }
  bool separator = text.size() > host->size() + (text[0] == '[' ? 2 : 0);
  if (separator && port->empty()) {
    *error = "'" + text + "': nothing after ':'";
    return false;
  }
  if (!ValidIp(*host)) {
    *error = "'" + text + "': '" + *host + "' is not a numeric IP address";
    return false;
  }
  return true;
}

}  // namespace

const char* ErrorClassName(ErrorClass e) {
  switch (e) {
    case ErrorClass::kOk:
      return "ok";
    case ErrorClass::kBusy:
      return "busy (too much in flight; retry after a send completes)";
    case ErrorClass::kBadConn:
      return "no such connection";
    case ErrorClass::kBadArg:
      return "invalid argument";
    case ErrorClass::kBadHost:
      return "invalid host description";
    case ErrorClass::kAlreadyConnected:
      return "already connected";
    case ErrorClass::kConnFailed:
      return "connection failed";
    case ErrorClass::kAuthFailed:
      return "authentication failed";
    case ErrorClass::kPeerClosed:
      return "closed by the peer";
    case ErrorClass::kConnReset:
      return "connection reset";
    case ErrorClass::kTimeout:
      return "timed out";
    case ErrorClass::kBadFrame:
      return "invalid frame from the peer";
    case ErrorClass::kTruncated:
      return "frame longer than the posted receive";
    case ErrorClass::kCanceled:
      return "canceled by close";
    case ErrorClass::kLimit:
      return "limit reached";
    case ErrorClass::kFail:
      return "failure";
  }
  return "unknown error class";
}

bool ParseListenAddress(const std::string& text, ListenAddress* out,
                        std::string* error) {
  std::string host, ports;
  if (!SplitHostPort(text, &host, &ports, error)) return false;
  ListenAddress a;
  a.host = host;
  if (!ports.empty()) {
    size_t dash = ports.find('-');
    std::string lo = ports.substr(0, dash);
    std::string hi = dash == std::string::npos ? lo : ports.substr(dash + 1);
    if (!ParsePort(lo, &a.port_lo) || !ParsePort(hi, &a.port_hi) ||
        a.port_lo > a.port_hi || (a.port_lo == 0 && a.port_hi != 0)) {
      *error = "'" + text + "': the port must be PORT or LOW-HIGH in 1-65535";
      return false;
    }
  }
  *out = a;
  return true;
}

std::string FormatHostDescription(const HostDescription& d) {
  std::string s = std::to_string(d.node) + "@";
  for (size_t i = 0; i < d.addresses.size(); i++) {
    if (i > 0) s += ",";
    const HostAddress& a = d.addresses[i];
    bool v6 = a.host.find(':') != std::string::npos;
    s += v6 ? "[" + a.host + "]" : a.host;
    s += ":" + std::to_string(a.port);
  }
  return s;
}

bool ParseHostDescription(const std::string& text, HostDescription* out,
                          std::string* error) {
  size_t at = text.find('@');
  if (at == std::string::npos || at == 0 || at > 20) {
    *error = "'" + text + "': expected NODE@ADDR:PORT[,ADDR:PORT...]";
    return false;
  }
  HostDescription d;
  errno = 0;
  char* end = nullptr;
  std::string node = text.substr(0, at);
  d.node = std::strtoull(node.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || d.node == 0 || node[0] == '-') {
    *error = "'" + text + "': the node id must be a non-zero number";
    return false;
  }
  size_t pos = at + 1;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma - pos);
    std::string host, port;
    if (!SplitHostPort(item, &host, &port, error)) return false;
    HostAddress a{host, 0};
    if (!ParsePort(port, &a.port) || a.port == 0) {
      *error = "'" + item + "': every address needs a port in 1-65535";
      return false;
    }
    if (d.addresses.size() == kMaxHostAddresses) {
      *error = "'" + text + "': more than 16 addresses";
      return false;
    }
    d.addresses.push_back(a);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  *out = d;
  return true;
}

bool IsLoopback(const std::string& host) {
  in_addr a4;
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1) {
    return (ntohl(a4.s_addr) >> 24) == 127;
  }
  in6_addr a6;
  return inet_pton(AF_INET6, host.c_str(), &a6) == 1 &&
         IN6_IS_ADDR_LOOPBACK(&a6);
}

}  // namespace psmd::hw
