package policypath

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	mnl "github.com/mdlayher/netlink"
	"sigs.k8s.io/knftables"

	"kurma.dev/kurma/internal/agent/nftbatch"
	"kurma.dev/kurma/internal/agent/nfthost"
	"kurma.dev/kurma/internal/policyrule"
	"kurma.dev/kurma/pkg/kerrors"
)

// Config configures a Path.
type Config struct {
	// HostNS is the network namespace that plays the host; empty: the
	// process's own.
	HostNS string
	// Table is the inet table (shared with the agent's other owners; we
	// never delete it). Default "kurma-agent".
	Table  string
	Logger *slog.Logger
}

// Path programs NetworkPolicy for local pods. Safe for concurrent use.
type Path struct {
	cfg  Config
	log  *slog.Logger
	nsf  *os.File
	nft  knftables.Interface
	conn *nfthost.Conn
	tbl  *nftables.Table
	sets [numSets]*nftables.Set

	mu   sync.Mutex     // guards everything below
	pods map[string]Pod // the wanted state, by owner key
	// checked holds the owners whose lists in pods are known to pass
	// validDir, so that a change that puts an overlay on such a list's
	// Base checks only the overlay, not the Base again.
	checked map[string]bool
	refs    map[elem]int32 // owners wanting each element
	// pending holds the elements touched since the last commit, each
	// with whether the kernel held it then. The kernel holds exactly the
	// elements of refs plus the pending ones marked true minus those
	// marked false: after a full Sync the kernel's sets are what refs
	// says, and each commit keeps it so; no copy of the kernel's
	// elements is kept, and none is read back.
	pending map[elem]bool
	kernel  int // elements in the kernel, as last written
	// trusted: refs mirrors the kernel (a full Sync succeeded in this
	// process and no transaction failed since), in the sets named by
	// ident (see identity); a Sync may then write only the difference.
	trusted bool
	ident   string
	written int // element operations of the last Sync or Apply (tests)
	// compared: allows the last Apply's list diffs compared (tests: a
	// change of overlays on a shared Base compares its overlays only).
	compared int
	opsBuf   []op // commit's, kept between changes (bounded by keptOps)
	// committed: how long the last Apply's transaction took (netlink
	// send and the kernel's answer), for benchmarks.
	committed time.Duration
	// raw is the netlink connection changes are committed on, txb the
	// buffer their transactions are encoded in (commitOps).
	raw *mnl.Conn
	txb []byte
}

// LastCommit returns the element operations and the transaction's time
// (netlink and kernel, without the walk before it) of the last Apply.
func (p *Path) LastCommit() (ops int, took time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.written, p.committed
}

// New writes the skeleton (sets, chains) into the table; elements a
// previous run left stay until Sync. It turns on bridge netfilter for
// IPv4 so that bridged pod traffic meets the forward hook.
func New(ctx context.Context, cfg Config) (_ *Path, retErr error) {
	if cfg.Table == "" {
		cfg.Table = "kurma-agent"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p := &Path{cfg: cfg, log: cfg.Logger}
	p.resetBooks(0, 0)
	nsPath := cfg.HostNS
	if nsPath == "" {
		nsPath = "/proc/self/ns/net"
	}
	f, err := os.Open(nsPath)
	if err != nil {
		return nil, kerrors.New(kerrors.NotFound, "policypath: host netns %s: %v", nsPath, err)
	}
	p.nsf = f
	defer func() {
		if retErr != nil {
			_ = p.Close()
		}
	}()
	if p.conn, err = nfthost.Open(cfg.HostNS); err != nil {
		return nil, fmt.Errorf("policypath: %w", err)
	}
	err = p.inHost(func() error {
		err := os.WriteFile("/proc/sys/net/bridge/bridge-nf-call-iptables", []byte("1"), 0o644)
		if errors.Is(err, os.ErrNotExist) {
			// No bridge netfilter (br_netfilter is not loaded, and an
			// agent cannot load modules): routed traffic is still
			// filtered; pod-to-pod traffic within one bridge is not.
			p.log.Warn("bridge netfilter unavailable (load br_netfilter): NetworkPolicy does not apply between pods of one subnet on one node")
		} else if err != nil {
			return fmt.Errorf("bridge netfilter: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("policypath: %w", err)
	}
	if p.nft, err = nfthost.Knft(cfg.HostNS, knftables.InetFamily, cfg.Table); err != nil {
		return nil, fmt.Errorf("policypath: %w", err)
	}
	p.tbl = nfthost.Inet(cfg.Table)
	for i, d := range setDefs {
		p.sets[i] = &nftables.Set{Table: p.tbl, Name: d.name, Interval: d.interval, Concatenation: d.keyLen > 4}
	}
	if _, err := p.writeSkeleton(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// Chain names.
const (
	chainFwd = "pol-fwd"
	chainIn  = "pol-in"
	chainEg  = "pol-eg"
)

// writeSkeleton writes the table, its sets and chains, unless every chain
// already holds its rules (the fingerprint of the rules is the comment of
// a chain's last rule, see inPlace): a restarted agent rewrites nothing.
// It reports whether it wrote.
func (p *Path) writeSkeleton(ctx context.Context) (bool, error) {
	tx := p.nft.NewTransaction()
	prints := map[string]string{}
	addRules := func(chain string, rules []string) {
		fp := fingerprint(chain, rules)
		prints[chain] = fp
		for i, r := range rules {
			rule := &knftables.Rule{Chain: chain, Rule: r}
			if i == len(rules)-1 {
				rule.Comment = knftables.PtrTo(fp)
			}
			tx.Add(rule)
		}
	}
	tx.Add(&knftables.Table{})
	for _, d := range setDefs {
		s := &knftables.Set{Name: d.name, Type: d.decl}
		if d.interval {
			s.Flags = []knftables.SetFlag{knftables.IntervalFlag}
		}
		tx.Add(s)
	}
	look := func(chain, local, peer string, base int) {
		tx.Add(&knftables.Chain{Name: chain})
		tx.Flush(&knftables.Chain{Name: chain})
		l, r := "ip "+local, "ip "+peer
		var rules []string
		for _, rule := range []struct {
			set int
			m   string
		}{
			{setInExact, l + " . " + r + " . meta l4proto . th dport"},
			{setInPeer, l + " . " + r},
			{setInPort, l + " . meta l4proto . th dport"},
			{setInRange, l + " . " + r + " . meta l4proto . th dport"},
			{setInCIDR, l + " . " + r},
		} {
			rules = append(rules, rule.m+" @"+setDefs[base+rule.set].name+" return")
		}
		addRules(chain, append(rules, "drop"))
	}
	look(chainIn, "daddr", "saddr", 0)
	look(chainEg, "saddr", "daddr", setEgExact-setInExact)
	typ, hook, prio := knftables.FilterType, knftables.ForwardHook, knftables.FilterPriority
	tx.Add(&knftables.Chain{Name: chainFwd, Type: &typ, Hook: &hook, Priority: &prio,
		Comment: knftables.PtrTo("NetworkPolicy of local pods")})
	tx.Flush(&knftables.Chain{Name: chainFwd})
	addRules(chainFwd, []string{
		"ct state established,related accept",
		"ip daddr @" + setDefs[setInIso].name + " jump " + chainIn,
		"ip saddr @" + setDefs[setEgIso].name + " jump " + chainEg,
	})
	if p.inPlace(prints) {
		return false, nil
	}
	if err := p.inHost(func() error { return p.nft.Run(ctx, tx) }); err != nil {
		return true, fmt.Errorf("policypath: write table %s: %w", p.cfg.Table, err)
	}
	return true, nil
}

// fingerprint names a chain's rules.
func fingerprint(chain string, rules []string) string {
	h := sha256.New()
	for _, s := range append([]string{chain}, rules...) {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return "kurma " + hex.EncodeToString(h.Sum(nil)[:8])
}

// inPlace reports whether each chain of prints exists and its last rule
// carries its fingerprint, and every set exists: read through netlink
// (no element is loaded). Any failure says no.
func (p *Path) inPlace(prints map[string]string) bool {
	sets, err := p.conn.GetSets(p.tbl)
	if err != nil {
		return false
	}
	names := map[string]bool{}
	for _, s := range sets {
		names[s.Name] = true
	}
	for _, d := range setDefs {
		if !names[d.name] {
			return false
		}
	}
	for chain, fp := range prints {
		rules, err := p.conn.GetRules(p.tbl, &nftables.Chain{Name: chain, Table: p.tbl})
		if err != nil || len(rules) == 0 {
			return false
		}
		if c, ok := userdata.GetString(rules[len(rules)-1].UserData, userdata.TypeComment); !ok || c != fp {
			return false
		}
	}
	return true
}

// Close releases the handles; the kernel state stays.
func (p *Path) Close() error {
	if p.raw != nil {
		_ = p.raw.Close()
	}
	if p.conn != nil {
		_ = p.conn.Close()
	}
	if p.nsf != nil {
		_ = p.nsf.Close()
	}
	return nil
}

func (p *Path) inHost(f func() error) error { return nfthost.InHost(p.cfg.HostNS, f) }

// Apply sets the wanted state of the pods in changes (nil: the pod is
// gone) and commits what differs in one transaction. The path keeps the
// pods' Allow slices as they are (the caller must not change them
// afterwards); when a pod's old and new lists are sorted as the engine
// sorts them, only the allows that differ are looked at.
func (p *Path) Apply(ctx context.Context, changes map[string]*Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var w walks
	for k, pod := range changes {
		p.setOwnerWith(k, pod, &w)
	}
	p.compared = w.n
	return p.commit(ctx)
}

func (p *Path) setOwner(k string, pod *Pod) { p.setOwnerWith(k, pod, nil) }

func (p *Path) setOwnerWith(k string, pod *Pod, w *walks) {
	old, had := p.pods[k]
	if pod != nil && had && p.patchOwner(&old, pod, p.checked[k], w) {
		p.pods[k] = *pod
		p.setChecked(k, true)
		return
	}
	p.setChecked(k, false)
	var olds []elem
	if had {
		olds = elementsOf(&old)
	}
	els := elementsOf(pod)
	if pod == nil {
		delete(p.pods, k)
	} else {
		p.pods[k] = *pod
	}
	p.diff(olds, els)
}

// diff moves one owner's references from olds to els (an owner refers
// to an element once, however often its list names it): only the elements
// in one of them change.
func (p *Path) diff(olds, els []elem) {
	keep := make(map[elem]bool, len(els))
	for _, e := range els {
		keep[e] = true
	}
	gone := make(map[elem]bool, len(olds))
	for _, e := range olds {
		if _, ok := keep[e]; ok {
			keep[e] = false // in both: unchanged
			continue
		}
		if !gone[e] {
			gone[e] = true
			p.unref(e)
		}
	}
	for e, add := range keep {
		if add {
			p.ref(e)
		}
	}
}

// resetBooks empties the wanted state and its bookkeeping (pods,
// checked, refs, pending), sized for owners owners and elems elements.
func (p *Path) resetBooks(owners, elems int) {
	p.pods = make(map[string]Pod, owners)
	p.checked = make(map[string]bool, owners)
	p.refs = make(map[elem]int32, elems)
	p.pending = map[elem]bool{}
}

// setChecked records whether owner k's lists are known to pass validDir.
func (p *Path) setChecked(k string, ok bool) {
	if ok {
		p.checked[k] = true
	} else {
		delete(p.checked, k)
	}
}

func (p *Path) ref(e elem) {
	n := p.refs[e]
	if _, ok := p.pending[e]; !ok {
		p.pending[e] = n > 0
	}
	p.refs[e] = n + 1
}

func (p *Path) unref(e elem) {
	n := p.refs[e]
	if _, ok := p.pending[e]; !ok {
		p.pending[e] = n > 0
	}
	if n <= 1 {
		delete(p.refs, e)
	} else {
		p.refs[e] = n - 1
	}
}

// patchOwner moves a pod from old to cur by walking their sorted allow
// lists together: only the allows that differ touch an element (and, when
// a ranged allow differs, the pod's interval elements are recomputed, few
// as they are). So a change costs O(allows compared), once per distinct
// pair of lists in one Apply (w, see walks), plus O(change) element work
// and allocation. It reports false, having done nothing,
// when the address or isolation changed or a list is not sorted (the
// caller then diffs every element).
//
// oldChecked says that old's isolated lists are known to pass validDir
// (then a new list on the same Base has only its overlay checked).
func (p *Path) patchOwner(old, cur *Pod, oldChecked bool, w *walks) bool {
	if old.IP != cur.IP || !cur.IP.Is4() || old.Ingress.Isolated != cur.Ingress.Isolated || old.Egress.Isolated != cur.Egress.Isolated {
		return false
	}
	olds, curs := [2]Dir{old.Ingress, old.Egress}, [2]Dir{cur.Ingress, cur.Egress}
	var diffs [2][]touched
	for d := range 2 {
		if !curs[d].Isolated {
			continue
		}
		t, ok := w.diff(olds[d], curs[d], oldChecked)
		if !ok {
			return false
		}
		diffs[d] = t
	}
	pod := u32(cur.IP)
	ranged := false
	touch := func(d int, a Allow, add bool) {
		e, rng, ok := exactElem(pod, d, a)
		switch {
		case !ok:
		case rng:
			ranged = true
		case add:
			p.ref(e)
		default:
			p.unref(e)
		}
	}
	for d := range 2 {
		for _, t := range diffs[d] {
			touch(d, t.a, t.add)
		}
	}
	if ranged {
		p.diff(rangedElems(old), rangedElems(cur))
	}
	return true
}

// walks remembers, during one Apply, the differences between the old
// and new lists of the pods patched so far, by the lists' identities:
// the engine hands the same list to the local pods alike in its
// computation (replicas of one workload), so a peer's change walks each
// distinct pair of lists once, however many pods share it.
type walks struct {
	m map[listPair]walked
	n int // allows compared
}

// walked is the diff of a pair of lists, ok false when one is not
// strictly sorted (then there is none).
type walked struct {
	t  []touched
	ok bool
}

// listPair identifies an old and a new list.
type listPair struct{ o, c policyrule.ListID }

// touched is one allow in which two lists differ: added (in the new list
// only) or taken out.
type touched struct {
	a   Allow
	add bool
}

// diff returns the allows in which the lists of o and c differ, in
// order, or false when one is not strictly sorted (validDir); from w
// when it walked the same pair already (w nil: no memo). When o and c
// share their Base (the engine's patch of a few allows: see
// policyrule.Dir), only their overlays are walked, O(overlay); and when
// o is known to be valid (oChecked), only c's overlay is checked, so
// the Base is not read at all but for a lookup of each overlay allow.
// Otherwise both lists are checked and walked. (A memo's answer holds
// whatever oChecked was: validity is a property of the lists, which
// never change.)
func (w *walks) diff(o, c Dir, oChecked bool) ([]touched, bool) {
	key := listPair{o.ID(), c.ID()}
	if w != nil {
		if r, ok := w.m[key]; ok {
			return r.t, r.ok
		}
	}
	var r walked
	n := 0
	switch {
	case !oChecked && !validDir(o):
	case o.SameBase(c):
		if validOverlay(c) {
			r, n = overlayDiff(o, c), o.Overlay()+c.Overlay()
		}
	case validDir(c):
		r, n = listDiff(o, c), o.Len()+c.Len()
	}
	if w != nil {
		w.n += n
		w.put(key, r)
	}
	return r.t, r.ok
}

// listDiff walks the lists of o and c together (both valid).
func listDiff(o, c Dir) walked {
	var out []touched
	oc, cc := o.Cursor(), c.Cursor()
	x, okx := oc.Next()
	y, oky := cc.Next()
	for okx || oky {
		switch {
		case okx && oky && x == y: // most are kept
			x, okx = oc.Next()
			y, oky = cc.Next()
		case !oky || (okx && policyrule.Compare(x, y) < 0):
			out = append(out, touched{x, false})
			x, okx = oc.Next()
		default:
			out = append(out, touched{y, true})
			y, oky = cc.Next()
		}
	}
	return walked{out, true}
}

// overlayDiff is the diff of o and c, which share their Base: an allow
// can differ only where an overlay names it. An allow of an Add list is
// not in the Base, one of a Del list is; so which lists name an allow
// tells whether each of o and c holds it. o and c are valid.
func overlayDiff(o, c Dir) walked {
	n := 0
	mergeOverlays(o, c, func(Allow, bool) { n++ })
	if n == 0 {
		return walked{ok: true}
	}
	out := make([]touched, 0, n)
	mergeOverlays(o, c, func(a Allow, add bool) { out = append(out, touched{a, add}) })
	return walked{out, true}
}

// mergeOverlays calls f, in order, for each allow in which the lists of
// o and c (of one Base) differ, with whether c holds it.
func mergeOverlays(o, c Dir, f func(a Allow, add bool)) {
	lists := [4][]Allow{o.Add, o.Del, c.Add, c.Del}
	for {
		// The least allow named by any overlay, and which name it.
		var least Allow
		found := false
		for _, l := range lists {
			if len(l) > 0 && (!found || policyrule.Compare(l[0], least) < 0) {
				least, found = l[0], true
			}
		}
		if !found {
			return
		}
		var in [4]bool
		for i, l := range lists {
			if len(l) > 0 && l[0] == least {
				in[i] = true
				lists[i] = l[1:]
			}
		}
		inBase := in[1] || in[3]
		had := in[0] || (inBase && !in[1])
		has := in[2] || (inBase && !in[3])
		if had != has {
			f(least, has)
		}
	}
}

func (w *walks) put(k listPair, r walked) {
	if w.m == nil {
		w.m = map[listPair]walked{}
	}
	w.m[k] = r
}

// Sync makes the kernel hold exactly the elements of all, whatever it
// held before (a previous run's elements after a restart or kill -9, or
// drift). The first Sync of a Path (and any after a failure) flushes
// every policy set and adds every wanted element in one netlink
// transaction. The transaction is atomic, so no packet meets a
// half-written state, and it costs O(elements) in the kernel, where
// reading the sets back to diff them costs more (a dump of a hashed set
// walks it from its start for each message).
//
// A later Sync in the same process (the periodic resync) whose sets are
// still the ones the last full sync wrote (same table and set handles,
// see identity) and hold a sample of the elements they should (probe)
// writes only the difference between the wanted state and the mirror, in
// one transaction: nothing when nothing changed. Elements a foreign
// writer added to the policy sets are not seen by that check; a restart
// (or any failed transaction) rewrites everything.
func (p *Path) Sync(ctx context.Context, all map[string]*Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	wrote, err := p.writeSkeleton(ctx)
	if err != nil {
		p.trusted = false
		return err
	}
	if !wrote && p.trusted {
		ok, err := p.syncDiff(ctx, all)
		if ok || err != nil {
			return err
		}
	}
	if err := p.syncFull(ctx, all); err != nil {
		p.trusted = false
		return err
	}
	p.trusted = true
	return nil
}

// probeEach is how many elements of each hashed set a diff sync looks up
// in the kernel before trusting its mirror.
const probeEach = 4

// syncDiff is Sync by difference: it reports false (having changed
// nothing) when the mirror cannot be trusted, or the difference is too
// large for one transaction.
func (p *Path) syncDiff(ctx context.Context, all map[string]*Pod) (bool, error) {
	c, err := p.dial()
	if err != nil {
		return false, err
	}
	defer c.Close()
	if id, err := p.identity(c); err != nil || id != p.ident {
		p.log.Warn("policypath: the policy sets were replaced; rewriting them", "err", err)
		return false, nil
	}
	var seen [numSets]int
	for e := range p.refs {
		if setDefs[e.set].interval || seen[e.set] >= probeEach {
			continue
		}
		seen[e.set]++
		ok, err := p.present(c, e)
		if err != nil || !ok {
			p.log.Warn("policypath: an element is missing from the kernel; rewriting the policy sets", "set", setDefs[e.set].name, "err", err)
			return false, nil
		}
	}
	for k, pod := range all {
		old, had := p.pods[k]
		if pod == nil {
			if had {
				p.setOwner(k, nil)
			}
			continue
		}
		if !had || !samePod(&old, pod) {
			p.setOwner(k, pod)
		}
	}
	for k := range p.pods {
		if _, ok := all[k]; !ok {
			p.setOwner(k, nil)
		}
	}
	if len(p.pending) > nftbatch.TxOps {
		return false, nil // syncFull rebuilds the mirror from all
	}
	if err := p.commit(ctx); err != nil {
		p.trusted = false
		return true, err
	}
	return true, nil
}

// samePod reports whether a and b want the same elements, without
// computing them.
func samePod(a, b *Pod) bool {
	return a.IP == b.IP && a.Ingress.Equal(b.Ingress) && a.Egress.Equal(b.Egress)
}

// syncFull flushes every policy set and adds every wanted element in one
// transaction, and rebuilds the mirror.
func (p *Path) syncFull(ctx context.Context, all map[string]*Pod) error {
	// Fresh maps sized for the state (a cold start would otherwise grow
	// them through many rehashes; a resync drops the old ones).
	n := 0
	for _, pod := range all {
		if pod != nil {
			n += 2 + pod.Ingress.Len() + pod.Egress.Len()
		}
	}
	p.resetBooks(len(all), n)
	p.kernel = -1 // unknown until the transaction succeeds
	var seen map[elem]bool
	for k, pod := range all {
		if pod == nil {
			continue
		}
		p.pods[k] = *pod
		els := elementsOf(pod)
		if distinct(pod) {
			p.checked[k] = true
		} else { // an owner refers to an element once
			if seen == nil {
				seen = map[elem]bool{}
			}
			clear(seen)
			els = slices.DeleteFunc(els, func(e elem) bool {
				dup := seen[e]
				seen[e] = true
				return dup
			})
		}
		for _, e := range els {
			p.refs[e]++
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("policypath: %w", err)
	}
	var count [numSets]int
	for e := range p.refs {
		count[e.set]++
	}
	var bySet [numSets][]elem
	for i, n := range count {
		bySet[i] = make([]elem, 0, n)
	}
	for e := range p.refs {
		bySet[e.set] = append(bySet[e.set], e)
	}
	// About 56 bytes an element (an interval one 80), and a message
	// header per nftbatch.MsgElems.
	t := &fullTx{b: make([]byte, 0, 64*len(p.refs)+4096)}
	t.begin()
	for i, d := range setDefs {
		t.flushSet(p.cfg.Table, d.name)
		t.addElems(p.cfg.Table, d, bySet[i])
	}
	t.finish()
	if err := p.send(t); err != nil {
		return fmt.Errorf("policypath: full sync of %d elements: %w", len(p.refs), err)
	}
	p.kernel = len(p.refs)
	p.written = len(p.refs)
	c, err := p.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	if p.ident, err = p.identity(c); err != nil {
		return err
	}
	return nil
}

// distinct reports whether pod's elements are distinct without a check:
// each direction's allows are strictly sorted (distinct allows then have
// distinct hashed elements, and the interval elements are disjoint by
// construction).
func distinct(pod *Pod) bool {
	return validDir(pod.Ingress) && validDir(pod.Egress)
}

// opKey places an op for nftbatch: its set (setDefs' index) and verb.
func opKey(o op) nftbatch.Key { return nftbatch.Key{Order: int(o.e.set), Del: o.del} }

type op struct {
	e   elem
	del bool
}

// commit brings every pending element to its wanted state: one netlink
// transaction, deletions first (commitOps). After a failed Sync (the kernel's state
// unknown) it refuses: the caller's next Sync repairs.
func (p *Path) commit(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("policypath: %w", err)
	}
	if p.kernel < 0 {
		return errors.New("policypath: the last full sync failed; the next one repairs")
	}
	ops := p.opsBuf[:0]
	if cap(ops) < len(p.pending) {
		ops = make([]op, 0, len(p.pending))
	}
	if cap(ops) <= keptOps {
		p.opsBuf = ops[:0]
	} else {
		p.opsBuf = nil
	}
	for e, have := range p.pending {
		if want := p.refs[e] > 0; want != have {
			ops = append(ops, op{e, have})
		}
	}
	p.written = len(ops)
	start := time.Now()
	err := p.commitOps(ops)
	p.committed = time.Since(start)
	if err != nil {
		p.trusted = false
		return fmt.Errorf("policypath: %w", err)
	}
	if len(ops) > 0 && p.log.Enabled(ctx, slog.LevelDebug) {
		p.log.Debug("policypath: commit", "touched", len(p.pending), "ops", len(ops), "took", time.Since(start))
	}
	clear(p.pending)
	return nil
}

// commitOps writes ops in nftbatch's order and batches (Sort,
// Transactions, Runs: deletions first, each run of one set in messages of
// at most nftbatch.MsgElems, one transaction per nftbatch.TxOps), as
// nftbatch.Commit does, but encoded directly into a buffer the Path keeps
// (fullTx) and sent on a netlink connection it keeps: a change allocates
// nothing per element, where the general library built each element's
// attributes and messages anew (a label change's 400 operations were
// about 250 KB of garbage).
func (p *Path) commitOps(ops []op) error {
	nftbatch.Sort(ops, opKey)
	for tx := range nftbatch.Transactions(ops) {
		t := fullTx{b: p.txb[:0]}
		t.begin()
		for k, run := range nftbatch.Runs(tx, opKey) {
			t.elems(p.cfg.Table, setDefs[k.Order], k.Del, len(run), func(i int) *elem { return &run[i].e })
		}
		t.finish()
		err := p.sendKept(&t)
		if cap(t.b) <= keptTx {
			p.txb = t.b[:0]
		}
		if err != nil {
			return err
		}
		for _, o := range tx {
			p.pending[o.e] = !o.del // what the kernel now holds
			if o.del {
				p.kernel--
			} else {
				p.kernel++
			}
		}
	}
	return nil
}

// keptOps is the most operations whose buffer commit keeps for the
// next change (a change's; a big sync's is dropped).
const keptOps = 1 << 14

// keptTx is the largest transaction sent on the kept connection (and
// whose buffer is kept): a change's; a larger one (a big diff sync) goes
// through send on a connection sized for it.
const keptTx = 1 << 20

// sendKept sends t on the kept connection, dialled when there is none;
// after any error the connection is dropped (acks may be left unread).
func (p *Path) sendKept(t *fullTx) error {
	if len(t.b) > keptTx {
		return p.send(t)
	}
	if p.raw == nil {
		c, err := p.dial()
		if err != nil {
			return err
		}
		if err := sizeBuffers(c, 2*keptTx, 4<<20); err != nil {
			_ = c.Close()
			return err
		}
		p.raw = c
	}
	if err := sendOn(p.raw, t); err != nil {
		_ = p.raw.Close()
		p.raw = nil
		return err
	}
	return nil
}

// Elements reports how many elements the kernel holds, as last written
// (a metric; -1 after a failed full sync).
func (p *Path) Elements() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kernel
}
