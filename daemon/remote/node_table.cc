#include "daemon/remote/node_table.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include <spdlog/spdlog.h>

#include "daemon/log.h"
#include "hw/fabric.h"

namespace psmd {

namespace {

// The table's text into *out; false (and *error, naming the line) on the
// first bad line.
bool ParseNodeTable(const std::string& text, std::map<uint16_t, NodeEntry>* out,
                    std::string* error) {
  std::istringstream in(text);
  std::string line;
  int n = 0;
  out->clear();
  while (std::getline(in, line)) {
    n++;
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string node, host, desc, extra;
    if (!(words >> node)) continue;
    if (!(words >> host >> desc) || (words >> extra)) {
      *error = "line " + std::to_string(n) +
               ": expected NODE HOSTNAME NODE@ADDR:PORT,...";
      return false;
    }
    char* end = nullptr;
    unsigned long id = strtoul(node.c_str(), &end, 10);
    hw::HostDescription parsed;
    std::string why;
    if (*end != '\0' || id == 0 || id > 0xffff) {
      *error = "line " + std::to_string(n) + ": node id 1 to 65535 expected";
      return false;
    }
    if (!hw::ParseHostDescription(desc, &parsed, &why) || parsed.node != id) {
      *error = "line " + std::to_string(n) + ": bad host description (" +
               (why.empty() ? "its node id differs" : why) + ")";
      return false;
    }
    (*out)[static_cast<uint16_t>(id)] = NodeEntry{host, desc};
  }
  return true;
}

}  // namespace

NodeTable::NodeTable(std::string file) : file_(std::move(file)) { Reload(); }

void NodeTable::Reload() {
  struct stat st;
  if (stat(file_.c_str(), &st) != 0) {
    spdlog::warn("fabric: cannot read the node table {}: {}", Escaped(file_),
                 strerror(errno));
    return;
  }
  int64_t mtime =
      int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  if (mtime == mtime_ns_) return;
  std::ifstream in(file_);
  std::stringstream text;
  text << in.rdbuf();
  std::map<uint16_t, NodeEntry> table;
  std::string error;
  if (!ParseNodeTable(text.str(), &table, &error)) {
    spdlog::warn("fabric: node table {}: {}; keeping the previous one",
                 Escaped(file_), error);
    return;
  }
  nodes_ = std::move(table);
  mtime_ns_ = mtime;
  spdlog::info("fabric: node table {}: {} nodes", Escaped(file_),
               nodes_.size());
}

const NodeEntry* NodeTable::Find(uint16_t node) const {
  auto entry = nodes_.find(node);
  return entry == nodes_.end() ? nullptr : &entry->second;
}

std::string NodeTable::HostName(uint16_t node) const {
  const NodeEntry* entry = Find(node);
  return entry == nullptr ? std::string() : entry->hostname;
}

std::string NodeTable::NodeName(uint16_t node) const {
  std::string name = "node " + std::to_string(node);
  std::string host = HostName(node);
  if (!host.empty()) name += " (" + host + ")";
  return name;
}

}  // namespace psmd
