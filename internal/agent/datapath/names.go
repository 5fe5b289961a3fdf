package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"kurma.dev/kurma/pkg/kerrors"
)

const (
	// maxIfName is the kernel's limit for interface names (IFNAMSIZ-1).
	maxIfName = 15
	// maxPrefix keeps at least 9 hex characters (36 bits) of the port hash.
	maxPrefix = 5
	// MaxVNI is the largest 24-bit VXLAN network identifier.
	MaxVNI = 1<<24 - 1
)

// Names derives link names and ownership aliases. The zero value is not
// usable; build it with newNames.
type names struct {
	prefix string // link name prefix, e.g. "ka"
	owner  string // alias owner tag, e.g. "kurma-agent"
}

func newNames(prefix, owner string) (names, error) {
	if prefix == "" || len(prefix) > maxPrefix {
		return names{}, kerrors.New(kerrors.Invalid, "link prefix %q: want 1 to %d characters", prefix, maxPrefix)
	}
	if err := ValidateIfName(prefix); err != nil {
		return names{}, err
	}
	if owner == "" || strings.ContainsAny(owner, ": \t\n") {
		return names{}, kerrors.New(kerrors.Invalid, "owner tag %q: want a non-empty word without ':' or spaces", owner)
	}
	return names{prefix: prefix, owner: owner}, nil
}

// hostVeth is the host end of a port's veth pair: prefix + "p" + as many
// hex digits of sha256(portID) as fit in an interface name.
func (n names) hostVeth(portID string) string {
	sum := sha256.Sum256([]byte(portID))
	h := hex.EncodeToString(sum[:])
	return n.prefix + "p" + h[:maxIfName-len(n.prefix)-1]
}

func (n names) bridge(vni uint32) string { return fmt.Sprintf("%sb%06x", n.prefix, vni) }
func (n names) vxlan(vni uint32) string  { return fmt.Sprintf("%sv%06x", n.prefix, vni) }

func (n names) portAlias(portID string) string { return n.owner + ":port:" + portID }
func (n names) vpcAlias(vni uint32) string {
	return n.owner + ":vpc:" + strconv.FormatUint(uint64(vni), 10)
}

// portFromAlias returns the port id an alias names, if it is one of ours.
func (n names) portFromAlias(alias string) (string, bool) {
	id, ok := strings.CutPrefix(alias, n.owner+":port:")
	return id, ok && id != ""
}

// vniFromAlias returns the VNI a VPC link alias names, if it is ours.
func (n names) vniFromAlias(alias string) (uint32, bool) {
	s, ok := strings.CutPrefix(alias, n.owner+":vpc:")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil || v == 0 || v > MaxVNI {
		return 0, false
	}
	return uint32(v), true
}

// ownsPort reports whether a link with this name and alias is the host end
// of a port we plugged, and which.
func (n names) ownsPort(name, alias string) (string, bool) {
	id, ok := n.portFromAlias(alias)
	if !ok || n.hostVeth(id) != name {
		return "", false
	}
	return id, true
}

// ownsVPCLink reports whether a link is our bridge (kind "bridge") or VXLAN
// device (kind "vxlan") for some VNI.
func (n names) ownsVPCLink(name, alias, kind string) (uint32, bool) {
	vni, ok := n.vniFromAlias(alias)
	if !ok {
		return 0, false
	}
	switch {
	case kind == "bridge" && name == n.bridge(vni):
	case kind == "vxlan" && name == n.vxlan(vni):
	default:
		return 0, false
	}
	return vni, true
}

// ValidatePortID rejects ids that cannot safely be used in an alias (the
// kernel's IFALIASZ is 256) or that contain control characters.
func ValidatePortID(id string) error {
	if id == "" || len(id) > 200 {
		return kerrors.New(kerrors.Invalid, "port id %q: want 1 to 200 characters", id)
	}
	for _, r := range id {
		if r < 0x21 || r > 0x7e {
			return kerrors.New(kerrors.Invalid, "port id %q: only printable ASCII without spaces", id)
		}
	}
	return nil
}

// ValidateIfName checks a Linux interface name: 1 to 15 bytes, none of
// '/', ':', whitespace or NUL, and not "." or "..".
func ValidateIfName(name string) error {
	if name == "" || len(name) > maxIfName || name == "." || name == ".." {
		return kerrors.New(kerrors.Invalid, "interface name %q: want 1 to %d bytes", name, maxIfName)
	}
	for _, r := range name {
		if r == '/' || r == ':' || r <= ' ' || r == 0x7f {
			return kerrors.New(kerrors.Invalid, "interface name %q: contains %q", name, r)
		}
	}
	return nil
}
