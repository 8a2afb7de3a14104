// The proto's PeerNodeStats against the list of peer counters
// (proto/counters.h): "node" = 1, then a uint64 field per counter of
// PSMD_PEER_COUNTERS with its name, numbered 2, 3, ... in the list's order,
// and no other field. (The daemon's copy into the proto names each field
// of the list, so a counter without its field does not build; this
// catches a field without its counter, which psmctl would never show. The
// proto is built for the lite runtime, without descriptors: its text is
// read instead.)
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "proto/counters.h"

namespace {

TEST(PeerCountersTest, PeerNodeStatsHasAFieldPerCounterInItsOrder) {
  std::vector<std::string> listed = {"uint32 node = 1"};
#define PSMD_LISTED(name, column, unit, help) \
  listed.push_back("uint64 " #name " = " + std::to_string(listed.size() + 1));
  PSMD_PEER_COUNTERS(PSMD_LISTED)
#undef PSMD_LISTED

  std::ifstream in("proto/control.proto");
  ASSERT_TRUE(in) << "proto/control.proto not found";
  std::stringstream text;
  text << in.rdbuf();
  const std::string proto = text.str();
  const size_t begin = proto.find("message PeerNodeStats {");
  ASSERT_NE(begin, std::string::npos);
  const std::string body =
      proto.substr(begin, proto.find("\n}", begin) - begin);
  std::vector<std::string> fields;
  const std::regex field(R"((\w+) (\w+) = (\d+);)");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), field);
       it != std::sregex_iterator(); ++it) {
    fields.push_back((*it)[1].str() + " " + (*it)[2].str() + " = " +
                     (*it)[3].str());
  }
  EXPECT_EQ(fields, listed);
}

}  // namespace
