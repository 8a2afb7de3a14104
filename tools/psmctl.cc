// psmctl: the operator's command line for psmd.
//
//   psmctl [--socket PATH] [--json] stats | endpoints | health
#include <unistd.h>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "client/control_client.h"

namespace {

using psmd::client::CallError;
using psmd::client::ControlClient;

int Usage(FILE* out) {
  fprintf(out,
          "usage: psmctl [--socket PATH] [--json] COMMAND\n"
          "commands:\n"
          "  stats      messages and bytes per endpoint and in total, uptime\n"
          "  endpoints  open endpoints: id, epid, job uuid, pid, uid\n"
          "  health     daemon version, uptime, endpoint count\n"
          "  close ID   close endpoint ID (its owner's uid or root only)\n"
          "  config     the daemon's effective configuration (TOML)\n"
          "The socket defaults to $PSMD_SOCKET, else %s.\n",
          psmd::client::kDefaultSocket);
  return out == stdout ? 0 : 2;
}

int Fail(const CallError& e) {
  fprintf(stderr, "psmctl: %s\n", e.message.c_str());
  return 1;
}

std::string Hex(uint64_t v) {
  char buf[24];
  snprintf(buf, sizeof(buf), "0x%016" PRIx64, v);
  return buf;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string StatsJson(const psmd::v1::EndpointStats& s, bool with_identity) {
  std::string out = "{";
  if (with_identity) {
    out += "\"endpoint_id\": " + std::to_string(s.endpoint_id()) + ", ";
    out += "\"epid\": " + JsonString(Hex(s.epid())) + ", ";
  }
  out += "\"msgs_sent\": " + std::to_string(s.msgs_sent());
  out += ", \"bytes_sent\": " + std::to_string(s.bytes_sent());
  out += ", \"msgs_received\": " + std::to_string(s.msgs_received());
  out += ", \"bytes_received\": " + std::to_string(s.bytes_received());
  out += ", \"unexpected_msgs\": " + std::to_string(s.unexpected_msgs());
  out += ", \"unexpected_bytes\": " + std::to_string(s.unexpected_bytes());
  out += ", \"posted_recvs\": " + std::to_string(s.posted_recvs());
  out += ", \"rndv_msgs_sent\": " + std::to_string(s.rndv_msgs_sent());
  out += ", \"rndv_bytes_sent\": " + std::to_string(s.rndv_bytes_sent());
  out += ", \"probes\": " + std::to_string(s.probes());
  out += ", \"sends_held\": " + std::to_string(s.sends_held());
  out += ", \"am_requests_sent\": " + std::to_string(s.am_requests_sent());
  out += ", \"am_replies_sent\": " + std::to_string(s.am_replies_sent());
  out += ", \"bad_descriptors\": " + std::to_string(s.bad_descriptors());
  return out + "}";
}

void PrintStatsRow(const char* name, const psmd::v1::EndpointStats& s) {
  printf("%-10s %12" PRIu64 " %14" PRIu64 " %12" PRIu64 " %14" PRIu64
         " %11" PRIu64 " %9" PRIu64 "\n",
         name, s.msgs_sent(), s.bytes_sent(), s.msgs_received(),
         s.bytes_received(), s.unexpected_msgs(), s.bad_descriptors());
}

int Stats(ControlClient& control, bool json) {
  psmd::v1::GetStatsReply r;
  if (CallError e = control.GetStats(&r); !e.ok()) return Fail(e);
  double uptime = static_cast<double>(r.uptime_ns()) / 1e9;
  if (json) {
    printf(
        "{\"uptime_seconds\": %.3f, \"endpoint_count\": %u, \"doorbells\": "
        "%" PRIu64 ", \"sleeps\": %" PRIu64 ",\n \"endpoints\": [",
        uptime, r.endpoint_count(), r.doorbells(), r.sleeps());
    for (int i = 0; i < r.endpoints_size(); i++) {
      printf("%s\n  %s", i ? "," : "", StatsJson(r.endpoints(i), true).c_str());
    }
    printf("],\n \"total\": %s}\n", StatsJson(r.total(), false).c_str());
    return 0;
  }
  printf("psmd up %.1f s, %u endpoints, %" PRIu64 " doorbells, %" PRIu64
         " sleeps\n",
         uptime, r.endpoint_count(), r.doorbells(), r.sleeps());
  printf("%-10s %12s %14s %12s %14s %11s %9s\n", "endpoint", "msgs_sent",
         "bytes_sent", "msgs_recv", "bytes_recv", "unexpected", "bad_desc");
  for (const auto& s : r.endpoints())
    PrintStatsRow(std::to_string(s.endpoint_id()).c_str(), s);
  PrintStatsRow("total", r.total());
  return 0;
}

int Endpoints(ControlClient& control, bool json) {
  psmd::v1::ListEndpointsReply r;
  if (CallError e = control.ListEndpoints(&r); !e.ok()) return Fail(e);
  if (json) {
    printf("[");
    for (int i = 0; i < r.endpoints_size(); i++) {
      const auto& e = r.endpoints(i);
      printf(
          "%s\n {\"endpoint_id\": %u, \"epid\": %s, \"job_uuid\": %s, \"pid\": "
          "%u, "
          "\"uid\": %u, \"gid\": %u, \"label\": %s, \"connections\": %u}",
          i ? "," : "", e.endpoint_id(), JsonString(Hex(e.epid())).c_str(),
          JsonString(e.job_uuid()).c_str(), e.pid(), e.uid(), e.gid(),
          JsonString(e.label()).c_str(), e.connections());
    }
    printf("]\n");
    return 0;
  }
  printf("%-8s %-18s %-36s %8s %6s %5s  %s\n", "id", "epid", "job_uuid", "pid",
         "uid", "conns", "label");
  for (const auto& e : r.endpoints()) {
    printf("%-8u %-18s %-36s %8u %6u %5u  %s\n", e.endpoint_id(),
           Hex(e.epid()).c_str(), e.job_uuid().c_str(), e.pid(), e.uid(),
           e.connections(), e.label().c_str());
  }
  return 0;
}

// The daemon's effective configuration, as TOML psmd reads.
int Config(ControlClient& control) {
  psmd::v1::GetConfigReply r;
  if (CallError e = control.GetConfig(&r); !e.ok()) return Fail(e);
  printf("# effective configuration of psmd (file: %s)\n%s",
         r.config_path().c_str(), r.toml().c_str());
  return 0;
}

int Health(ControlClient& control, bool json) {
  psmd::v1::HealthReply r;
  if (CallError e = control.Health(&r); !e.ok()) return Fail(e);
  double uptime = static_cast<double>(r.uptime_ns()) / 1e9;
  if (json) {
    printf(
        "{\"version\": %s, \"uptime_seconds\": %.3f, \"endpoint_count\": %u, "
        "\"pid\": %u}\n",
        JsonString(r.version()).c_str(), uptime, r.endpoint_count(),
        r.daemon_pid());
  } else {
    printf("psmd %s (pid %u): up %.1f s, %u endpoints\n", r.version().c_str(),
           r.daemon_pid(), uptime, r.endpoint_count());
  }
  return 0;
}

int Close(ControlClient& control, const std::string& id_text) {
  char* end = nullptr;
  unsigned long id = strtoul(id_text.c_str(), &end, 10);
  if (id_text.empty() || *end != '\0' || id == 0 || id > 0xffffffffu) {
    fprintf(stderr,
            "psmctl: close needs an endpoint id (see psmctl endpoints)\n");
    return 2;
  }
  if (CallError e = control.CloseEndpoint(static_cast<uint32_t>(id)); !e.ok())
    return Fail(e);
  printf("closed endpoint %lu\n", id);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket = psmd::client::SocketPath();
  bool json = false;
  std::string command;
  std::string operand;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else if (arg.rfind("--socket=", 0) == 0) {
      socket = arg.substr(9);
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--help" || arg == "-h") {
      return Usage(stdout);
    } else if (command.empty() && arg[0] != '-') {
      command = arg;
    } else if (command == "close" && operand.empty()) {
      operand = arg;
    } else {
      fprintf(stderr, "psmctl: unexpected argument '%s'\n", arg.c_str());
      return Usage(stderr);
    }
  }
  if (command.empty()) return Usage(stderr);
  if (access(socket.c_str(), F_OK) != 0) {
    fprintf(stderr,
            "psmctl: no psmd socket at %s; is psmd running? (--socket or "
            "PSMD_SOCKET)\n",
            socket.c_str());
    return 1;
  }
  ControlClient control(socket);
  if (command == "stats") return Stats(control, json);
  if (command == "endpoints") return Endpoints(control, json);
  if (command == "health") return Health(control, json);
  if (command == "close") return Close(control, operand);
  if (command == "config") return Config(control);
  fprintf(stderr, "psmctl: unknown command '%s'\n", command.c_str());
  return Usage(stderr);
}
