// The inter-node engine's sources, and what they need beside the engine's
// (the handover codec's arena reader, the fabric's host descriptions, the
// in-process fabric), as one translation unit: what
// daemon/remote/remote_state_fuzz.sh compiles with clang and its
// sanitizers in every run of //daemon/remote:remote_state_fuzz_test. Each
// of these files parses the engine's, spdlog's and fmt's headers, most of
// its compile: together they took 38 s of CPU here instead of 76 s apart
// (2026-12-07). Not built by Bazel. A name two of them define at file
// scope breaks this build (node_table.cc's NowMs would: it compiles
// apart).
#include "daemon/handover/handover.cc"
#include "daemon/remote/flow_control.cc"
#include "daemon/remote/peers.cc"
#include "daemon/remote/proxy_ids.cc"
#include "daemon/remote/receive.cc"
#include "daemon/remote/remote_handover.cc"
#include "daemon/remote/rma.cc"
#include "daemon/remote/send.cc"
#include "daemon/remote/wire.cc"
#include "hw/fabric.cc"
#include "hw/frame.cc"
#include "hw/loopback_fabric.cc"
