// How psmctl writes numbers and strings: human-readable by default (1.2 M,
// 3.4 GiB), exact in JSON and Prometheus; client-supplied text escaped so
// that it cannot break a table row, a JSON string or a label value.
//
// Thread-safety: pure functions.
#ifndef PSMD_TOOLS_FORMAT_H_
#define PSMD_TOOLS_FORMAT_H_

#include <cstdint>
#include <string>

#include "proto/counters.h"

namespace psmd::tools {

// 999 -> "999", 12.5 -> "12.5" (a rate), 1234567 -> "1.2 M"; bytes:
// 1023 -> "1023 B", 3.4 * 2^30 -> "3.4 GiB".
std::string Human(double value, counters::Unit unit);

// "1 endpoint", "2 endpoints": a count with its noun, singular or plural
// (nouns whose plural adds an "s").
std::string Counted(uint64_t n, const std::string& noun);

// An instant as ISO 8601 UTC with milliseconds, "2026-12-06T02:13:22.123Z":
// what --watch stamps its lines with.
std::string UtcTimestamp(int64_t unix_ms);

// A JSON string literal, quotes included.
std::string JsonString(const std::string& s);

// A Prometheus label value (backslash, quote and newline escaped), quotes
// included.
std::string PromLabel(const std::string& s);

// Printable ASCII kept, anything else as \xNN: a client's label cannot
// split or forge a row of psmctl's table. (psmd already escapes what
// clients send in this form; a backslash passes unchanged, so its escapes
// are shown as they are, not escaped twice.)
std::string Printable(const std::string& s);

}  // namespace psmd::tools

#endif  // PSMD_TOOLS_FORMAT_H_
