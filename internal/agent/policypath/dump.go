package policypath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// dumpBuf is the receive buffer of the read-back connection. The kernel
// sizes each message of a dump by the largest buffer the reader has
// passed to recvmsg (capped near 32 KiB); the netlink library's default
// (a buffer exactly as large as the next message) keeps them at about a
// page. A set's dump walks the set from its start for every message,
// skipping what earlier ones sent, so its cost is quadratic in the
// number of messages: 8 times fewer messages make it about 8 times
// cheaper at 200,000 elements.
const dumpBuf = 64 << 10

// nftaSetElemKeyEnd is NFTA_SET_ELEM_KEY_END (linux/netfilter/nf_tables.h),
// which x/sys/unix does not define.
const nftaSetElemKeyEnd = 10

// readSet dumps set i (NFT_MSG_GETSETELEM with NLM_F_DUMP) through a
// connection with large receive buffers and returns its elements (Kernel);
// interval end markers are left out.
func (p *Path) readSet(i int) ([]elem, error) {
	c, err := mnl.Dial(unix.NETLINK_NETFILTER, &mnl.Config{NetNS: int(p.nsf.Fd()), MessageBufferSize: dumpBuf})
	if err != nil {
		return nil, fmt.Errorf("policypath: netlink: %w", err)
	}
	defer c.Close()
	ae := mnl.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, p.cfg.Table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, setDefs[i].name)
	attrs, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	msgs, err := c.Execute(mnl.Message{
		Header: mnl.Header{Type: mnl.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM),
			Flags: mnl.Request | mnl.Dump},
		Data: append([]byte{unix.NFPROTO_INET, 0, 0, 0}, attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("policypath: dump set %s: %w", setDefs[i].name, err)
	}
	var out []elem
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		els, err := parseElems(m.Data[4:], uint8(i))
		if err != nil {
			return nil, fmt.Errorf("policypath: dump set %s: %w", setDefs[i].name, err)
		}
		out = append(out, els...)
	}
	return out, nil
}

// parseElems decodes the element list of one GETSETELEM reply.
func parseElems(b []byte, set uint8) ([]elem, error) {
	ad, err := mnl.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	var out []elem
	for ad.Next() {
		if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			continue
		}
		ad.Nested(func(list *mnl.AttributeDecoder) error {
			for list.Next() {
				if list.Type() != unix.NFTA_LIST_ELEM {
					continue
				}
				var key, end []byte
				var flags uint32
				list.Nested(func(el *mnl.AttributeDecoder) error {
					for el.Next() {
						switch el.Type() {
						case unix.NFTA_SET_ELEM_KEY:
							key = dataValue(el)
						case nftaSetElemKeyEnd:
							end = dataValue(el)
						case unix.NFTA_SET_ELEM_FLAGS:
							if v := el.Bytes(); len(v) == 4 {
								flags = binary.BigEndian.Uint32(v)
							}
						}
					}
					return el.Err()
				})
				if flags&unix.NFT_SET_ELEM_INTERVAL_END != 0 {
					continue
				}
				if setDefs[set].interval {
					key = append(key[:len(key):len(key)], end...)
				}
				out = append(out, mkElem(int(set), key))
			}
			return list.Err()
		})
	}
	return out, ad.Err()
}

// dataValue reads the NFTA_DATA_VALUE inside a nested data attribute.
func dataValue(ad *mnl.AttributeDecoder) []byte {
	var v []byte
	ad.Nested(func(d *mnl.AttributeDecoder) error {
		for d.Next() {
			if d.Type() == unix.NFTA_DATA_VALUE {
				v = d.Bytes()
			}
		}
		return d.Err()
	})
	return v
}

// Attribute numbers x/sys/unix does not define (linux/netfilter/nf_tables.h).
const (
	nftaTableHandle = 4  // NFTA_TABLE_HANDLE
	nftaSetHandle   = 16 // NFTA_SET_HANDLE
)

// dial opens a netlink netfilter connection in the host namespace for
// the reads below (the library's connection has no handles or single
// element lookups).
func (p *Path) dial() (*mnl.Conn, error) {
	c, err := mnl.Dial(unix.NETLINK_NETFILTER, &mnl.Config{NetNS: int(p.nsf.Fd())})
	if err != nil {
		return nil, fmt.Errorf("policypath: netlink: %w", err)
	}
	return c, nil
}

func nftMsg(typ int, flags mnl.HeaderFlags, attrs []byte) mnl.Message {
	return mnl.Message{Header: mnl.Header{Type: mnl.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ), Flags: mnl.Request | flags},
		Data: append([]byte{unix.NFPROTO_INET, 0, 0, 0}, attrs...)}
}

// identity names the kernel objects the policy sets are: the table's
// handle and each policy set's handle. The kernel gives a recreated table
// a new handle (tables are numbered per network namespace, never reused),
// so an equal identity means the sets written by the last full sync still
// exist (possibly with other elements: see probe).
func (p *Path) identity(c *mnl.Conn) (string, error) {
	ae := mnl.NewAttributeEncoder()
	ae.String(unix.NFTA_TABLE_NAME, p.cfg.Table)
	attrs, err := ae.Encode()
	if err != nil {
		return "", err
	}
	msgs, err := c.Execute(nftMsg(unix.NFT_MSG_GETTABLE, 0, attrs))
	if err != nil {
		return "", fmt.Errorf("policypath: get table %s: %w", p.cfg.Table, err)
	}
	var b strings.Builder
	err = eachAttrs(msgs, func(ad *mnl.AttributeDecoder) {
		for ad.Next() {
			if ad.Type() == nftaTableHandle {
				fmt.Fprintf(&b, "table %d", ad.Uint64())
			}
		}
	})
	if err != nil {
		return "", err
	}
	ae = mnl.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_TABLE, p.cfg.Table)
	if attrs, err = ae.Encode(); err != nil {
		return "", err
	}
	if msgs, err = c.Execute(nftMsg(unix.NFT_MSG_GETSET, mnl.Dump, attrs)); err != nil {
		return "", fmt.Errorf("policypath: list sets of %s: %w", p.cfg.Table, err)
	}
	handles := map[string]uint64{}
	err = eachAttrs(msgs, func(ad *mnl.AttributeDecoder) {
		var name string
		var h uint64
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_SET_NAME:
				name = ad.String()
			case nftaSetHandle:
				h = ad.Uint64()
			}
		}
		handles[name] = h
	})
	if err != nil {
		return "", err
	}
	for _, d := range setDefs {
		fmt.Fprintf(&b, " %s %d", d.name, handles[d.name])
	}
	return b.String(), nil
}

// eachAttrs calls fn with the attributes of each nftables message of msgs
// (after its 4-byte nfgenmsg header).
func eachAttrs(msgs []mnl.Message, fn func(*mnl.AttributeDecoder)) error {
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := mnl.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return err
		}
		fn(ad)
	}
	return nil
}

// present reports whether the kernel holds element e of a hashed set
// (one NFT_MSG_GETSETELEM lookup, O(1) in the kernel).
func (p *Path) present(c *mnl.Conn, e elem) (bool, error) {
	ae := mnl.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, p.cfg.Table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, setDefs[e.set].name)
	ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(ae *mnl.AttributeEncoder) error {
		ae.Nested(unix.NFTA_LIST_ELEM, func(ae *mnl.AttributeEncoder) error {
			ae.Nested(unix.NFTA_SET_ELEM_KEY, func(ae *mnl.AttributeEncoder) error {
				ae.Bytes(unix.NFTA_DATA_VALUE, e.key[:e.keyLen()])
				return nil
			})
			return nil
		})
		return nil
	})
	attrs, err := ae.Encode()
	if err != nil {
		return false, err
	}
	_, err = c.Execute(nftMsg(unix.NFT_MSG_GETSETELEM, 0, attrs))
	var oe *mnl.OpError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &oe) && errors.Is(oe.Err, unix.ENOENT):
		return false, nil
	}
	return false, fmt.Errorf("policypath: get element of %s: %w", setDefs[e.set].name, err)
}
