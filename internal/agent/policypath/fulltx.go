package policypath

import (
	"encoding/binary"
	"errors"
	"fmt"

	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"kurma.dev/kurma/internal/agent/nftbatch"
)

// fullTx is the netlink batch of a full sync, encoded directly into one
// buffer: a flush of every policy set, then every element in messages of
// nftbatch.MsgElems. A full sync of 200,000 elements is about 10 MB of
// messages; the general library builds each element as attribute values
// and copies the batch as it grows, which cost more than the kernel's
// own work of writing them.
type fullTx struct {
	b    []byte
	seq  uint32
	msgs int // messages that ask for an ack
}

const nlmsgHdrLen = 16

// msg starts a message of type typ and returns its offset (end closes it).
func (t *fullTx) msg(typ uint16, flags uint16, resID uint16, family byte) int {
	at := len(t.b)
	t.seq++
	t.b = binary.NativeEndian.AppendUint32(t.b, 0) // length, set by end
	t.b = binary.NativeEndian.AppendUint16(t.b, typ)
	t.b = binary.NativeEndian.AppendUint16(t.b, flags)
	t.b = binary.NativeEndian.AppendUint32(t.b, t.seq)
	t.b = binary.NativeEndian.AppendUint32(t.b, 0)
	t.b = append(t.b, family, unix.NFNETLINK_V0)
	t.b = binary.BigEndian.AppendUint16(t.b, resID)
	if flags&unix.NLM_F_ACK != 0 {
		t.msgs++
	}
	return at
}

func (t *fullTx) end(at int) {
	binary.NativeEndian.PutUint32(t.b[at:], uint32(len(t.b)-at))
}

// attr starts an attribute (nested when the caller appends attributes
// into it) and returns its offset; close it with attrEnd.
func (t *fullTx) attr(typ uint16) int {
	at := len(t.b)
	t.b = append(t.b, 0, 0, 0, 0)
	binary.NativeEndian.PutUint16(t.b[at+2:], typ)
	return at
}

func (t *fullTx) attrEnd(at int) {
	binary.NativeEndian.PutUint16(t.b[at:], uint16(len(t.b)-at))
	for len(t.b)%4 != 0 {
		t.b = append(t.b, 0)
	}
}

func (t *fullTx) bytes(typ uint16, v []byte) {
	at := t.attr(typ)
	t.b = append(t.b, v...)
	t.attrEnd(at)
}

func (t *fullTx) str(typ uint16, s string) {
	at := t.attr(typ)
	t.b = append(t.b, s...)
	t.b = append(t.b, 0)
	t.attrEnd(at)
}

const (
	nftMsgType = unix.NFNL_SUBSYS_NFTABLES << 8
	nested     = unix.NLA_F_NESTED
)

// flushSet adds the flush of set name (a DELSETELEM without elements).
func (t *fullTx) flushSet(table, name string) {
	at := t.msg(nftMsgType|unix.NFT_MSG_DELSETELEM, unix.NLM_F_REQUEST|unix.NLM_F_ACK, 0, unix.NFPROTO_INET)
	t.str(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	t.str(unix.NFTA_SET_ELEM_LIST_SET, name)
	t.end(at)
}

// addElems adds the elements els of set d in messages of at most
// nftbatch.MsgElems.
func (t *fullTx) addElems(table string, d setDef, els []elem) {
	for len(els) > 0 {
		n := min(len(els), nftbatch.MsgElems)
		t.elems(table, d, false, n, func(i int) *elem { return &els[i] })
		els = els[n:]
	}
}

// elems adds one message adding (del: deleting) the n elements at(0)
// ... at(n-1) of set d.
func (t *fullTx) elems(table string, d setDef, del bool, n int, at func(int) *elem) {
	typ, flags := uint16(unix.NFT_MSG_NEWSETELEM), uint16(unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE)
	if del {
		typ, flags = unix.NFT_MSG_DELSETELEM, unix.NLM_F_REQUEST|unix.NLM_F_ACK
	}
	m := t.msg(nftMsgType|typ, flags, 0, unix.NFPROTO_INET)
	t.str(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	t.str(unix.NFTA_SET_ELEM_LIST_SET, d.name)
	list := t.attr(unix.NFTA_SET_ELEM_LIST_ELEMENTS | nested)
	for i := range n {
		e := at(i)
		item := t.attr(uint16(i+1) | nested)
		k := t.attr(unix.NFTA_SET_ELEM_KEY | nested)
		t.bytes(unix.NFTA_DATA_VALUE, e.key[:d.keyLen])
		t.attrEnd(k)
		if d.interval {
			k := t.attr(nftaSetElemKeyEnd | nested)
			t.bytes(unix.NFTA_DATA_VALUE, e.key[d.keyLen:2*d.keyLen])
			t.attrEnd(k)
		}
		t.attrEnd(item)
	}
	t.attrEnd(list)
	t.end(m)
}

// begin and finish open and close the batch.
func (t *fullTx) begin() {
	t.end(t.msg(unix.NFNL_MSG_BATCH_BEGIN, unix.NLM_F_REQUEST, unix.NFNL_SUBSYS_NFTABLES, unix.AF_UNSPEC))
}
func (t *fullTx) finish() {
	t.end(t.msg(unix.NFNL_MSG_BATCH_END, unix.NLM_F_REQUEST, unix.NFNL_SUBSYS_NFTABLES, unix.AF_UNSPEC))
}

// send writes the batch in one sendmsg on a new connection (with send
// and receive buffers large enough for it and its acks) and reads one ack
// per message that asked for one; the first error fails it (the kernel
// then applied none of the batch).
func (p *Path) send(t *fullTx) error {
	c, err := p.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	if err := sizeBuffers(c, len(t.b)+(1<<20), 8<<20); err != nil {
		return err
	}
	return sendOn(c, t)
}

// sizeBuffers sets c's send and receive buffers.
func sizeBuffers(c *mnl.Conn, snd, rcv int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("policypath: %w", err)
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		serr = errors.Join(unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, snd),
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcv))
	})
	if err = errors.Join(err, serr); err != nil {
		return fmt.Errorf("policypath: socket buffers: %w", err)
	}
	return nil
}

// sendOn writes the batch in one sendmsg on c and reads one ack per
// message that asked for one; the first error fails it (the kernel then
// applied none of the batch, and acks may be left unread on c).
func sendOn(c *mnl.Conn, t *fullTx) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("policypath: %w", err)
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), t.b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		return !errors.Is(serr, unix.EAGAIN)
	})
	if err = errors.Join(err, serr); err != nil {
		return fmt.Errorf("policypath: send %d bytes: %w", len(t.b), err)
	}
	for got := 0; got < t.msgs; {
		msgs, err := c.Receive()
		if err != nil {
			return fmt.Errorf("policypath: transaction: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Type == mnl.Error {
				got++
			}
		}
	}
	return nil
}
