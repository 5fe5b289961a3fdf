package stager

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"kurma.dev/kurma/pkg/appc"
	"kurma.dev/kurma/pkg/kerrors"
)

// Isolators of an app that shape its privileges.
const (
	// IsolatorCapsRetain replaces the default capability set with exactly
	// the listed one: {"set": ["CAP_NET_ADMIN", ...]}.
	IsolatorCapsRetain = "os/linux/capabilities-retain-set"
	// IsolatorCapsRemove removes the listed capabilities from the default
	// (or retained) set: {"set": ["CAP_NET_RAW"]}.
	IsolatorCapsRemove = "os/linux/capabilities-remove-set"
	// IsolatorNoNewPrivs, with the value false, lets the app's processes
	// gain privileges through setuid binaries and file capabilities; by
	// default no_new_privs is set.
	IsolatorNoNewPrivs = "os/linux/no-new-privileges"
)

// capNames maps every capability name the kernel headers know to its
// number.
var capNames = map[string]uint{
	"CAP_CHOWN": unix.CAP_CHOWN, "CAP_DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE,
	"CAP_DAC_READ_SEARCH": unix.CAP_DAC_READ_SEARCH, "CAP_FOWNER": unix.CAP_FOWNER,
	"CAP_FSETID": unix.CAP_FSETID, "CAP_KILL": unix.CAP_KILL, "CAP_SETGID": unix.CAP_SETGID,
	"CAP_SETUID": unix.CAP_SETUID, "CAP_SETPCAP": unix.CAP_SETPCAP,
	"CAP_LINUX_IMMUTABLE": unix.CAP_LINUX_IMMUTABLE, "CAP_NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE,
	"CAP_NET_BROADCAST": unix.CAP_NET_BROADCAST, "CAP_NET_ADMIN": unix.CAP_NET_ADMIN,
	"CAP_NET_RAW": unix.CAP_NET_RAW, "CAP_IPC_LOCK": unix.CAP_IPC_LOCK, "CAP_IPC_OWNER": unix.CAP_IPC_OWNER,
	"CAP_SYS_MODULE": unix.CAP_SYS_MODULE, "CAP_SYS_RAWIO": unix.CAP_SYS_RAWIO,
	"CAP_SYS_CHROOT": unix.CAP_SYS_CHROOT, "CAP_SYS_PTRACE": unix.CAP_SYS_PTRACE,
	"CAP_SYS_PACCT": unix.CAP_SYS_PACCT, "CAP_SYS_ADMIN": unix.CAP_SYS_ADMIN,
	"CAP_SYS_BOOT": unix.CAP_SYS_BOOT, "CAP_SYS_NICE": unix.CAP_SYS_NICE,
	"CAP_SYS_RESOURCE": unix.CAP_SYS_RESOURCE, "CAP_SYS_TIME": unix.CAP_SYS_TIME,
	"CAP_SYS_TTY_CONFIG": unix.CAP_SYS_TTY_CONFIG, "CAP_MKNOD": unix.CAP_MKNOD, "CAP_LEASE": unix.CAP_LEASE,
	"CAP_AUDIT_WRITE": unix.CAP_AUDIT_WRITE, "CAP_AUDIT_CONTROL": unix.CAP_AUDIT_CONTROL,
	"CAP_SETFCAP": unix.CAP_SETFCAP, "CAP_MAC_OVERRIDE": unix.CAP_MAC_OVERRIDE,
	"CAP_MAC_ADMIN": unix.CAP_MAC_ADMIN, "CAP_SYSLOG": unix.CAP_SYSLOG, "CAP_WAKE_ALARM": unix.CAP_WAKE_ALARM,
	"CAP_BLOCK_SUSPEND": unix.CAP_BLOCK_SUSPEND, "CAP_AUDIT_READ": unix.CAP_AUDIT_READ,
	"CAP_PERFMON": unix.CAP_PERFMON, "CAP_BPF": unix.CAP_BPF, "CAP_CHECKPOINT_RESTORE": unix.CAP_CHECKPOINT_RESTORE,
}

// DefaultCaps is the capability set an app's processes get unless an
// isolator says otherwise: the one Docker and containerd give containers.
var DefaultCaps = mustCaps("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE")

// CapSet is a set of capabilities, bit n standing for capability n.
type CapSet uint64

func mustCaps(names ...string) CapSet {
	c, err := parseCaps(names)
	if err != nil {
		panic(err)
	}
	return c
}

// parseCaps accepts names with or without the CAP_ prefix, in any case.
func parseCaps(names []string) (CapSet, error) {
	var c CapSet
	for _, n := range names {
		u := strings.ToUpper(n)
		if !strings.HasPrefix(u, "CAP_") {
			u = "CAP_" + u
		}
		bit, ok := capNames[u]
		if !ok {
			return 0, kerrors.New(kerrors.Invalid, "unknown capability %q", n)
		}
		c |= 1 << bit
	}
	return c, nil
}

// Has reports whether capability n is in c.
func (c CapSet) Has(n uint) bool { return n < 64 && c&(1<<n) != 0 }

// Privileges is what an app's processes may do: their capability set and
// whether no_new_privs is left off.
type Privileges struct {
	Caps CapSet `json:"caps"`
	// AllowNewPrivs leaves no_new_privs unset.
	AllowNewPrivs bool `json:"allowNewPrivs,omitempty"`
}

// appPrivileges derives an app's privileges from its isolators.
func appPrivileges(isolators []appc.Isolator) (Privileges, error) {
	p := Privileges{Caps: DefaultCaps}
	var remove CapSet
	for _, iso := range isolators {
		switch iso.Name {
		case IsolatorCapsRetain, IsolatorCapsRemove:
			var v struct {
				Set []string `json:"set"`
			}
			if err := json.Unmarshal(iso.Value, &v); err != nil {
				return p, kerrors.New(kerrors.Invalid, "isolator %s: %v", iso.Name, err)
			}
			c, err := parseCaps(v.Set)
			if err != nil {
				return p, fmt.Errorf("isolator %s: %w", iso.Name, err)
			}
			if iso.Name == IsolatorCapsRetain {
				p.Caps = c
			} else {
				remove |= c
			}
		case IsolatorNoNewPrivs:
			var on bool
			if err := json.Unmarshal(iso.Value, &on); err != nil {
				return p, kerrors.New(kerrors.Invalid, "isolator %s: want true or false: %v", iso.Name, err)
			}
			p.AllowNewPrivs = !on
		}
	}
	p.Caps &^= remove
	return p, nil
}

// spawner starts processes like syscall.ForkExec, each from a thread whose
// bounding and inheritable capability sets are cut down to the process's
// Privileges (and no_new_privs set) first. The child inherits the thread's
// credentials, keeps the full effective set for what ForkExec does before
// exec (clone a mount namespace, chroot, setuid), and gets at most
// priv.Caps after exec.
//
// There is one such thread per distinct Privileges, made on first use and
// kept for the life of the process: its goroutine locks it and never
// unlocks, so no other goroutine ever runs on it, and the runtime discards
// it if the goroutine ends. Making and discarding a thread per process
// was a measurable part of every call-in (bench/README.md, "Figures behind
// design choices").
//
// Locking: mu guards threads. A thread runs one ForkExec at a time.
type spawner struct {
	mu      sync.Mutex
	threads map[Privileges]chan<- spawnReq
}

type spawnReq struct {
	argv0 string
	argv  []string
	attr  *syscall.ProcAttr
	reply chan<- spawnResult
}

type spawnResult struct {
	pid int
	err error
}

// forkExec starts argv[0] with attr from the thread for priv.
func (sp *spawner) forkExec(argv0 string, argv []string, attr *syscall.ProcAttr, priv Privileges) (int, error) {
	ch, err := sp.thread(priv)
	if err != nil {
		return 0, err
	}
	reply := make(chan spawnResult, 1)
	ch <- spawnReq{argv0: argv0, argv: argv, attr: attr, reply: reply}
	r := <-reply
	return r.pid, r.err
}

// thread returns the request channel of priv's thread, starting it first
// if needed. A thread that could not be confined is not kept.
func (sp *spawner) thread(priv Privileges) (chan<- spawnReq, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if ch, ok := sp.threads[priv]; ok {
		return ch, nil
	}
	ch := make(chan spawnReq)
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // for good: see spawner
		if err := confineThread(priv); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for r := range ch {
			pid, err := syscall.ForkExec(r.argv0, r.argv, r.attr)
			r.reply <- spawnResult{pid, err}
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	if sp.threads == nil {
		sp.threads = map[Privileges]chan<- spawnReq{}
	}
	sp.threads[priv] = ch
	return ch, nil
}

// confineThread narrows the calling (locked) thread's capabilities.
func confineThread(priv Privileges) error {
	for c := uint(0); c <= 63; c++ {
		if priv.Caps.Has(c) {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			if err == unix.EINVAL {
				break // past the kernel's last capability
			}
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable &= uint32(priv.Caps)
	data[1].Inheritable &= uint32(priv.Caps >> 32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	if !priv.AllowNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("set no_new_privs: %w", err)
		}
	}
	return nil
}
