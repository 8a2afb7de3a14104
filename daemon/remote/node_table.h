// The node table (--fabric-nodes): which host, at which fabric addresses,
// is each node id. One line per node, "NODE HOSTNAME HOSTDESCRIPTION"
// (hw/fabric.h's NODE@ADDR:PORT,...), '#' comments. The file is read again
// when its modification time changes, at the moments the inter-node engine
// asks (a connect to a node it has no connection to, a lost peer); a file
// that does not parse leaves the previous table in place, so an operator's
// half-written edit never takes nodes away.
//
// Thread-safety: not thread-safe; a NodeTable belongs to the inter-node
// engine of one progress worker.
#ifndef PSMD_DAEMON_REMOTE_NODE_TABLE_H_
#define PSMD_DAEMON_REMOTE_NODE_TABLE_H_

#include <cstdint>
#include <map>
#include <string>

namespace psmd {

struct NodeEntry {
  std::string hostname;
  std::string description;  // NODE@ADDR:PORT,...
};
class NodeTable {
 public:
  // Reads `file` once (host names for what is logged before a connect).
  explicit NodeTable(std::string file);

  // Reads the file again if it changed.
  void Reload();
  // The entry of `node`, or nullptr.
  const NodeEntry* Find(uint16_t node) const;
  // Its host name, or "" if the table has no line for it.
  std::string HostName(uint16_t node) const;
  // "node N (HOSTNAME)", for messages to clients.
  std::string NodeName(uint16_t node) const;
  const std::string& file() const { return file_; }

 private:
  const std::string file_;
  std::map<uint16_t, NodeEntry> nodes_;
  int64_t mtime_ns_ = -1;  // of the version read
};

}  // namespace psmd

#endif  // PSMD_DAEMON_REMOTE_NODE_TABLE_H_
