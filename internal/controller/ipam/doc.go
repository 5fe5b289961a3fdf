// Package ipam is the controller's pure address logic: parsing and
// validating subnets (IPv4 and IPv6, gateway, allocation pools), mapping
// addresses to offsets and fixed-size bitmap blocks, finding free addresses
// without scanning ports (Tracker: next-fit over cached block bitmaps plus
// in-flight reservations), and generating MAC addresses and VXLAN ids.
//
// Persistence is not here: the controller stores each block's bitmap as one
// key (BlockBytes bytes) and sets/clears bits in store transactions, so an
// address is never handed out twice even across replicas; the Tracker is
// only a cache that proposes candidates.
//
// Locking: Subnet is immutable after New. Tracker.mu guards its blocks,
// pending bits and cursor; all Tracker methods are safe for concurrent use.
//
// Imports nothing of Kurma but pkg/kerrors.
package ipam
