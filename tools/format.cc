#include "tools/format.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <ctime>

namespace psmd::tools {

std::string Human(double value, counters::Unit unit) {
  const bool bytes = unit == counters::Unit::kBytes;
  static const char* const kBinary[] = {"B",   "KiB", "MiB", "GiB",
                                        "TiB", "PiB", "EiB"};
  static const char* const kDecimal[] = {"", "k", "M", "G", "T", "P", "E"};
  const double base = bytes ? 1024 : 1000;
  char buf[48];
  if (std::fabs(value) < base) {
    // Below the first prefix: whole numbers stay exact, rates keep a digit.
    bool whole = value == std::floor(value);
    snprintf(buf, sizeof(buf), whole ? "%.0f%s%s" : "%.1f%s%s", value,
             bytes ? " " : "", bytes ? "B" : "");
    return buf;
  }
  int prefix = 0;
  while (std::fabs(value) >= base && prefix < 6) {
    value /= base;
    prefix++;
  }
  snprintf(buf, sizeof(buf), "%.1f %s", value,
           bytes ? kBinary[prefix] : kDecimal[prefix]);
  return buf;
}

std::string Counted(uint64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

std::string UtcTimestamp(int64_t unix_ms) {
  const time_t seconds = static_cast<time_t>(unix_ms / 1000);
  struct tm utc;
  gmtime_r(&seconds, &utc);
  char buf[32];
  const size_t n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &utc);
  snprintf(buf + n, sizeof(buf) - n, ".%03dZ",
           static_cast<int>(unix_ms % 1000));
  return buf;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string PromLabel(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Printable(const std::string& s) {
  std::string out;
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\x%02x", u);
      out += buf;
    }
  }
  return out;
}

}  // namespace psmd::tools
