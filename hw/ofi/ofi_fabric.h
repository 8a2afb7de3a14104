// The libfabric backend of hw::Fabric: one FI_EP_RDM endpoint per daemon,
// bound to its listen address through the chosen provider ("tcp;ofi_rxm",
// "udp;ofi_rxd", ...), an address vector of the peer nodes, and one
// completion queue polled by the progress worker.
//
// RDM has no connections, so they are emulated: a connection is a pair of
// random 64-bit keys (one per side) and an ordered byte stream in each
// direction carried by the msg interface (fi_send/fi_recv) in messages of
// at most one chunk, each prefixed with the receiver's key, the sender's key
// and the stream offset. The stream carries exactly the socket backend's
// frames (frame.h), handshake included: the connector's first message
// (kContact) carries its libfabric address, the acceptor answers with its
// own (kAccept) and a Challenge frame, and MUNGE authentication
// (hw/munge_auth.h) runs as over TCP before any data frame is accepted.
//
// Three kinds of endpoint, because a provider may keep state per peer
// address for as long as an endpoint lives, whatever the address vector
// says (ofi_rxd keeps its sequence numbers: a daemon restarted at an
// address its peers had talked to is not heard by them again). Like a
// listening socket and its connections: the listen endpoint, bound to
// --fabric-listen, only receives contacts; the data endpoint, at a port
// the system picks anew at every start, carries every connection; each
// connect attempt sends its contact from an endpoint of its own, closed
// once answered. No long-lived endpoint thus talks to an address that
// comes back with a new daemon behind it. Receives land in a pool of
// registered buffers and are copied into a per-connection stream buffer,
// bounded by a window the receiver grants (kCredit messages as the user
// consumes frames), so a receiver that posts nothing holds its senders back
// and nothing is dropped. Sends are copied into registered bounce buffers
// (the code registers all it hands the provider, so FI_MR_LOCAL providers
// run it unchanged). Where the provider offers FI_RMA|FI_READ, regions
// registered once are read by peers with fi_read (Fabric::PostRead),
// straight into a registered region of the reader's: no bounce buffer.
// Liveness: keepalive messages, a silent peer is closed after timeout_ms. A
// handover (ExportSessions) tells each peer that its connection broke and may
// resume, since nothing else would tell it (no end of file over RDM), and
// closes every endpoint before it returns, so the successor listens at the
// same address at once. See hw/README.md and docs/design.md for what is
// assumed of providers this machine cannot run.
//
// Thread-safety: as hw::Fabric (one thread), plus the private MUNGE helper
// thread when authentication is on.
#ifndef PSMD_HW_OFI_OFI_FABRIC_H_
#define PSMD_HW_OFI_OFI_FABRIC_H_

#include <memory>
#include <string>

#include "hw/fabric.h"

namespace psmd::hw {

// Null with *error (what is wrong and the fix) when the options are bad, the
// provider is unknown or cannot serve psmd (no FI_EP_RDM with FI_MSG, not
// addressed by IP address and port), or no port in the range is free.
// Exactly one listen address (one endpoint).
std::unique_ptr<Fabric> OpenOfiFabric(const FabricOptions& options,
                                      std::string* error);

// psmd --fabric-info: a line per provider, fabric and domain that offers
// psmd what it needs (an FI_EP_RDM endpoint with FI_MSG, its memory
// registration and context modes), as fi_info would list them, each said
// usable or why not (an address other than IP and port) in *out; returns
// how many are usable. `provider` narrows it (libfabric's syntax, as
// --fabric-provider).
int DescribeOfiProviders(const std::string& provider, std::string* out);

}  // namespace psmd::hw

#endif  // PSMD_HW_OFI_OFI_FABRIC_H_
