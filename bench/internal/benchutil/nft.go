package benchutil

import (
	"errors"

	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// GetElem asks the kernel for one element of an inet set or map
// (NFT_MSG_GETSETELEM, no dump: it costs the same at any set size) and
// returns its data, or ok false when it does not exist. Benchmarks read
// "programmed" this way, never by exec'ing nft.
func GetElem(c *mnl.Conn, table, set string, key []byte) (data []byte, ok bool, err error) {
	ae := mnl.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(ae *mnl.AttributeEncoder) error {
		ae.Nested(1, func(ae *mnl.AttributeEncoder) error {
			ae.Nested(unix.NFTA_SET_ELEM_KEY, func(ae *mnl.AttributeEncoder) error {
				ae.Bytes(unix.NFTA_DATA_VALUE, key)
				return nil
			})
			return nil
		})
		return nil
	})
	attrs, err := ae.Encode()
	if err != nil {
		return nil, false, err
	}
	req, err := c.Send(mnl.Message{
		// No ack: one reply, the element or an error.
		Header: mnl.Header{Type: mnl.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM), Flags: mnl.Request},
		Data:   append([]byte{unix.NFPROTO_INET, 0, 0, 0}, attrs...),
	})
	if err != nil {
		return nil, false, err
	}
	resp, err := c.Receive()
	if err != nil {
		var oe *mnl.OpError
		if errors.As(err, &oe) && errors.Is(oe.Err, unix.ENOENT) {
			return nil, false, nil
		}
		return nil, false, err
	}
	for _, m := range resp {
		// The reply carries our sequence number; anything else is stale.
		if m.Header.Sequence == req.Header.Sequence && m.Header.Type != mnl.Error && len(m.Data) > 4 {
			return m.Data[4:], true, nil
		}
	}
	return nil, false, nil
}
