package policypath

import (
	"encoding/binary"
	"fmt"

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
