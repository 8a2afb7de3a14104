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

// The table's text into *out; false (and *error, naming the line) on the
// first bad line.
bool ParseNodeTable(const std::string& text, std::map<uint16_t, NodeEntry>* out,
                    std::string* error);

// fabric_nodes_command (docs/operations.md, "The node table from Slurm"):
// runs `command` with /bin/sh -c in psmd's environment, stdin /dev/null, for
// at most kNodeTableCommandTimeoutMs; its stdout must parse as a node table.
// When it does and differs from what `file` holds, writes it there (to a
// temporary file beside it, renamed over it, so an inter-node engine never
// reads half a table) and sets *changed. Otherwise (the command failed, timed
// out, or printed a bad table) returns false with *error (its exit status and
// the end of its stderr, or the parse error) and leaves `file` as it was: a
// Slurm controller that does not answer never takes nodes away. *table: what
// the command printed, when it parsed. Blocking; main thread only.
inline constexpr int kNodeTableCommandTimeoutMs = 30000;
bool RunNodeTableCommand(const std::string& command, const std::string& file,
                         std::map<uint16_t, NodeEntry>* table, bool* changed,
                         std::string* error);

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
