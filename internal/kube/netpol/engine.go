package netpol

import (
	"maps"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"

	"kurma.dev/kurma/internal/policyrule"
)

// Engine computes the rules of one node's pods. Build it with NewEngine;
// feed it with the Set and Delete methods; Compute returns the rules that
// changed.
type Engine struct {
	node string
	pods map[string]*Pod            // by namespace/name
	byNS map[string]map[string]*Pod // namespace -> name -> pod
	// localNS holds the local pods only, so that a policy's change looks
	// at the node's pods of its namespace, not the cluster's.
	localNS  map[string]map[string]*Pod
	nsLabels map[string]labels.Set
	policies map[string]*policy            // by namespace/name
	polByNS  map[string]map[string]*policy // namespace -> name -> policy
	// polLocal: policy key -> the local pods it selected at their last
	// computation; a change of a peer or namespace dirties them.
	polLocal map[string]map[string]bool
	podPols  map[string][]string // local pod -> the policies whose polLocal holds it
	// polBySel groups each namespace's policies by podSelector, so that a
	// pod is matched once per distinct selector.
	polBySel map[string]map[string]*selGroup
	// bySig groups the policies by peer signature (sigKey): a pod's
	// change checks each signature once.
	bySig map[string]map[string]*policy
	rules map[string]*Rules // last computed, by local pod key
	// contrib counts, per local pod, how many (policy, rule, peer, port)
	// contributions make each Allow, so that a peer's change is applied
	// as a delta (peerDelta) instead of a recomputation.
	contrib map[string]*podContrib
	dirty   map[string]bool // local pods to recompute
	deltas  map[string]bool // local pods whose contrib a delta changed
	// memo holds, during one Compute, the pods each peer selector matched
	// (policies often share selectors).
	memo map[string][]*Pod
	sels selCache
	// weights keeps, per peer signature, peersChanged's weights while
	// its policies and their polLocal entries stay as they are
	// (sigWeights, weightDelta).
	weights map[string]*shapeWeights
	stats   Stats
	last    Stats
}

// Stats is what the engine did since the last Compute began, through
// that Compute's end: for benchmarks and tests, to tell which work a
// change caused.
type Stats struct {
	// WeightsBuilt: signatures whose shapeWeights were (re)computed.
	WeightsBuilt int
	// Recomputed: local pods recomputed from scratch by Compute;
	// Patched: local pods whose rules Compute patched after deltas.
	Recomputed, Patched int
	// Changed: pods whose rules Compute returned.
	Changed int
}

// LastStats returns the Stats of the last Compute (and the changes fed
// before it).
func (e *Engine) LastStats() Stats { return e.last }

// NewEngine returns an empty engine for node.
func NewEngine(node string) *Engine {
	return &Engine{node: node, pods: map[string]*Pod{}, byNS: map[string]map[string]*Pod{}, localNS: map[string]map[string]*Pod{},
		nsLabels: map[string]labels.Set{}, policies: map[string]*policy{}, polByNS: map[string]map[string]*policy{},
		polLocal: map[string]map[string]bool{}, podPols: map[string][]string{}, polBySel: map[string]map[string]*selGroup{}, bySig: map[string]map[string]*policy{}, rules: map[string]*Rules{}, dirty: map[string]bool{},
		contrib: map[string]*podContrib{}, deltas: map[string]bool{}}
}

func (e *Engine) local(p *Pod) bool { return p != nil && p.Node == e.node }

// SetPod adds or replaces a pod.
func (e *Engine) SetPod(p *Pod) {
	k := p.Key()
	old := e.pods[k]
	e.pods[k] = p
	if e.byNS[p.Namespace] == nil {
		e.byNS[p.Namespace] = map[string]*Pod{}
	}
	e.byNS[p.Namespace][p.Name] = p
	switch {
	case e.local(p):
		if e.localNS[p.Namespace] == nil {
			e.localNS[p.Namespace] = map[string]*Pod{}
		}
		e.localNS[p.Namespace][p.Name] = p
	case e.local(old):
		e.unlocal(p.Namespace, p.Name)
	}
	e.podChanged(k, old, p)
}

func (e *Engine) unlocal(namespace, name string) {
	delete(e.localNS[namespace], name)
	if len(e.localNS[namespace]) == 0 {
		delete(e.localNS, namespace)
	}
}

// DeletePod forgets a pod.
func (e *Engine) DeletePod(namespace, name string) {
	k := namespace + "/" + name
	old, ok := e.pods[k]
	if !ok {
		return
	}
	delete(e.pods, k)
	delete(e.byNS[namespace], name)
	if len(e.byNS[namespace]) == 0 {
		delete(e.byNS, namespace)
	}
	e.unlocal(namespace, name)
	e.podChanged(k, old, nil)
}

func (e *Engine) podChanged(k string, old, cur *Pod) {
	if e.local(old) || e.local(cur) {
		e.dirty[k] = true
	}
	if old != nil && cur != nil && old.IP == cur.IP && old.Inactive == cur.Inactive &&
		maps.Equal(old.Labels, cur.Labels) && slices.Equal(old.Ports, cur.Ports) {
		return // nothing a peer match depends on
	}
	if len(e.polLocal) == 0 {
		return // no local pod has contributions yet (a cold start's lists)
	}
	// One namesPeer per distinct peer signature, then only the policies
	// of the signatures that name the pod (before or after).
	// The local pods' state, looked up once per pod rather than once per
	// policy naming the peer.
	var ls map[string]*localRef
	for sk, pks := range e.bySig {
		var rep *policy
		for _, pol := range pks {
			rep = pol
			break
		}
		if rep == nil || !(e.namesPeer(rep, old) || e.namesPeer(rep, cur)) {
			continue
		}
		// The policies of one signature have the same peers, so which of
		// them the pod matches is worked out once (selector matching is
		// the costly part of a delta).
		mOld, mCur := e.matches(rep, old), e.matches(rep, cur)
		if sameAddrPorts(old, cur) && mOld.equal(mCur) {
			continue // the old contributions equal the new ones
		}
		if ls == nil {
			ls = map[string]*localRef{}
		}
		e.peersChanged(ls, sk, pks, old, cur, mOld, mCur)
	}
}

// shapeLocal is a local pod and the shape of policies selecting it.
type shapeLocal struct{ shape, local string }

// peersChanged applies peer x's change (old to cur, whose matches are
// mOld and mCur) to the local pods of the policies pks (of one peer
// signature), as deltas where their contributions are current. The
// policies of one shape (the same ports too) contribute alike to a local
// pod, so each local pod gets one delta per shape, weighted by how many
// of the shape's policies select it, instead of one per policy: the
// allows and counts touched scale with the distinct shapes, not with
// the policies naming the peer.
func (e *Engine) peersChanged(ls map[string]*localRef, sk string, pks map[string]*policy, old, cur *Pod, mOld, mCur *peerMatch) {
	sw := e.sigWeights(sk, pks)
	for k, w := range sw.weight {
		r := e.ref(ls, k.local)
		if r.c == nil {
			continue // recomputed by the next Compute
		}
		// The local pod's rules are current but for this peer: take its
		// old contributions out and put the new ones in.
		pol := sw.rep[k.shape]
		e.peerDelta(r.c, pol, r.pod, old, mOld, -w)
		e.peerDelta(r.c, pol, r.pod, cur, mCur, w)
	}
}

// shapeWeights is what peersChanged needs of one peer signature's
// policies: per shape and local pod, how many of the shape's policies
// select the pod (in polLocal), and one policy of each shape.
type shapeWeights struct {
	weight map[shapeLocal]int32
	rep    map[string]*policy
}

// sigWeights returns signature sk's shapeWeights (its policies pks),
// from e.weights or computed and kept there (policyDelta keeps them in
// step, weightDelta; a Compute of dirty pods drops them): a run of peer changes (pods relabelled,
// readdressed) costs one pass over the policies naming them, then one
// delta per shape and local pod each.
func (e *Engine) sigWeights(sk string, pks map[string]*policy) *shapeWeights {
	if sw, ok := e.weights[sk]; ok {
		return sw
	}
	e.stats.WeightsBuilt++
	sw := &shapeWeights{weight: map[shapeLocal]int32{}, rep: map[string]*policy{}}
	for pk, pol := range pks {
		locals := e.polLocal[pk]
		if len(locals) == 0 {
			continue
		}
		sw.rep[pol.shape] = pol
		for l := range locals {
			sw.weight[shapeLocal{pol.shape, l}]++
		}
	}
	if e.weights == nil {
		e.weights = map[string]*shapeWeights{}
	}
	e.weights[sk] = sw
	return sw
}

// weightDelta keeps the kept shapeWeights of pol's signature in step
// with pol's polLocal entry for local pod l, which policyDelta just
// changed (sign 1: added, -1: taken out), so that a policy's change
// costs O(its local pods) here too, and the peer changes after it find
// their weights kept instead of rebuilding them from every policy of
// the signature. The representative of a shape may be a policy since
// deleted or replaced: a shape's policies contribute alike (its
// signature and ports say all peerDelta reads).
//
// The weights are exact for the local pods whose contributions are
// current (not dirty), the only ones peersChanged uses; a Compute of
// dirty pods rewrites polLocal and forgets them all.
func (e *Engine) weightDelta(pol *policy, l string, sign int32) {
	sw, ok := e.weights[sigKey(pol)]
	if !ok {
		return // built when a peer change needs it
	}
	k := shapeLocal{pol.shape, l}
	if n := sw.weight[k] + sign; n > 0 {
		sw.weight[k] = n
	} else {
		delete(sw.weight, k)
	}
	if sign > 0 {
		sw.rep[pol.shape] = pol
	}
}

// localRef is a local pod's state during one podChanged: its pod and
// contributions, nil when it is to be recomputed.
type localRef struct {
	pod *Pod
	c   *podContrib
}

// ref returns local pod l's localRef, marking it dirty (c nil) or as
// changed by a delta.
func (e *Engine) ref(ls map[string]*localRef, l string) *localRef {
	if r, ok := ls[l]; ok {
		return r
	}
	r := &localRef{pod: e.pods[l], c: e.contrib[l]}
	if e.dirty[l] || r.c == nil {
		e.dirty[l] = true
		r.c = nil
	} else {
		e.deltas[l] = true
	}
	ls[l] = r
	return r
}

// peerMatch says, per direction (0 ingress, 1 egress), rule and peer
// entry of a policy, whether a pod matches that peer entry's selectors.
type peerMatch [2][][]bool

// matches is the peerMatch of pod x for pol (and every policy of its
// signature); nil when x is not an active pod.
func (e *Engine) matches(pol *policy, x *Pod) *peerMatch {
	if x == nil || !x.active() {
		return nil
	}
	var m peerMatch
	for d, rs := range [2][]rule{pol.inRules, pol.egRules} {
		m[d] = make([][]bool, len(rs))
		for i, ru := range rs {
			m[d][i] = make([]bool, len(ru.peers))
			for j, pe := range ru.peers {
				m[d][i][j] = !pe.block && e.peerMatches(pol.namespace, pe, x)
			}
		}
	}
	return &m
}

// equal reports whether m and o say the same (both nil: no match at all).
func (m *peerMatch) equal(o *peerMatch) bool {
	if m == nil || o == nil {
		return m == o
	}
	for d := range 2 {
		for i := range m[d] {
			if !slices.Equal(m[d][i], o[d][i]) {
				return false
			}
		}
	}
	return true
}

// sameAddrPorts reports whether a and b are active with the same address
// and named ports: all a peer's allows depend on besides its matches.
func sameAddrPorts(a, b *Pod) bool {
	return a.active() && b.active() && a.IP == b.IP && slices.Equal(a.Ports, b.Ports)
}

// podContrib is a local pod's isolation (how many of its policies
// isolate it, per direction) and counted contributions.
type podContrib struct {
	isoIn, isoEg int32
	in, eg       map[Allow]int32
	// flipIn, flipEg: the Allows whose count crossed zero since the last
	// Compute, so that Compute patches the last rules instead of sorting
	// them all again.
	flipIn, flipEg map[Allow]bool
}

// count adds sign to a's count in set, noting a in flip when it crosses
// zero.
func count(set map[Allow]int32, flip map[Allow]bool, a Allow, sign int32) {
	n := set[a]
	m := n + sign
	if m <= 0 {
		delete(set, a)
		m = 0
	} else {
		set[a] = m
	}
	if (n > 0) != (m > 0) {
		flip[a] = true
	}
}

// reuse returns flip map f emptied, or nil when it is large.
func reuse(f map[Allow]bool) map[Allow]bool {
	if len(f) > 256 {
		return nil
	}
	clear(f)
	return f
}

// flips returns f, made when nil.
func flips(f *map[Allow]bool) map[Allow]bool {
	if *f == nil {
		*f = map[Allow]bool{}
	}
	return *f
}

// peerDelta adds sign times what peer x (whose matches are m, see
// matches) contributes through pol's rules to local pod l (exactly what
// addRule counts for x).
func (e *Engine) peerDelta(c *podContrib, pol *policy, l, x *Pod, m *peerMatch, sign int32) {
	if x == nil || !x.active() || l == nil || m == nil {
		return
	}
	var buf [8]Allow
	apply := func(set map[Allow]int32, flip map[Allow]bool, rs []rule, ms [][]bool, egress bool) {
		for i, ru := range rs {
			for _, a := range peerAllows(buf[:0], ru, ms[i], l, x, egress) {
				count(set, flip, a, sign)
			}
		}
	}
	if pol.ingress {
		apply(c.in, flips(&c.flipIn), pol.inRules, m[0], false)
	}
	if pol.egress {
		apply(c.eg, flips(&c.flipEg), pol.egRules, m[1], true)
	}
}

// peerAllows appends to out, with repetitions, the Allows of rule ru that
// involve pod x as a peer of local pod l: once per peer entry x matches
// (matched[i] for peer entry i) and per port, plus egress named ports
// reached through address ranges.
func peerAllows(out []Allow, ru rule, matched []bool, l, x *Pod, egress bool) []Allow {
	xa := A4(x.IP)
	one := func(pr Proto, lo, hi uint16) {
		out = append(out, Allow{PeerLo: xa, PeerHi: xa, Proto: pr, PortLo: lo, PortHi: hi})
	}
	inRange := ru.allPeers
	for i, pe := range ru.peers {
		if pe.block {
			inRange = inRange || inRanges(pe.ranges, xa)
			continue
		}
		if !matched[i] {
			continue
		}
		if ru.allPorts {
			one(0, 0, 0)
			continue
		}
		for _, pt := range ru.ports {
			switch {
			case pt.name == "":
				one(pt.proto, pt.lo, pt.hi)
			case !egress:
				if n, ok := l.namedPort(pt.name, pt.proto); ok {
					one(pt.proto, n, n)
				}
			default:
				if n, ok := x.namedPort(pt.name, pt.proto); ok {
					one(pt.proto, n, n)
				}
			}
		}
	}
	if egress && !ru.allPorts && inRange {
		for _, pt := range ru.ports {
			if pt.name == "" {
				continue
			}
			if n, ok := x.namedPort(pt.name, pt.proto); ok {
				one(pt.proto, n, n)
			}
		}
	}
	return out
}

// namesPeer reports whether a rule of pol may allow p as a peer.
func (e *Engine) namesPeer(pol *policy, p *Pod) bool {
	if !p.active() {
		return false
	}
	check := func(rs []rule, egress bool) bool {
		for _, r := range rs {
			named := false
			for _, pt := range r.ports {
				named = named || pt.name != ""
			}
			if r.allPeers && egress && named {
				return true
			}
			for _, pe := range r.peers {
				if pe.block {
					if egress && named && inRanges(pe.ranges, A4(p.IP)) {
						return true
					}
					continue
				}
				if e.peerMatches(pol.namespace, pe, p) {
					return true
				}
			}
		}
		return false
	}
	return (pol.ingress && check(pol.inRules, false)) || (pol.egress && check(pol.egRules, true))
}

func (e *Engine) peerMatches(polNS string, pe peer, p *Pod) bool {
	if pe.nsSel == nil {
		if p.Namespace != polNS {
			return false
		}
	} else if !pe.nsSel.Matches(e.nsLabels[p.Namespace]) {
		return false
	}
	return pe.pods == nil || pe.pods.Matches(labels.Set(p.Labels))
}

// SetNamespace records a namespace's labels.
func (e *Engine) SetNamespace(name string, l map[string]string) {
	old, ok := e.nsLabels[name]
	e.nsLabels[name] = labels.Set(l)
	if ok && maps.Equal(old, labels.Set(l)) {
		return
	}
	e.dirtyNSPolicies()
}

// DeleteNamespace forgets a namespace.
func (e *Engine) DeleteNamespace(name string) {
	if _, ok := e.nsLabels[name]; !ok {
		return
	}
	delete(e.nsLabels, name)
	e.dirtyNSPolicies()
}

// dirtyNSPolicies dirties the local pods of every policy with a
// namespaceSelector.
func (e *Engine) dirtyNSPolicies() {
	for pk, locals := range e.polLocal {
		pol := e.policies[pk]
		if pol == nil || !pol.usesNS() {
			continue
		}
		for l := range locals {
			e.dirty[l] = true
		}
	}
}

func (p *policy) usesNS() bool {
	for _, rs := range [][]rule{p.inRules, p.egRules} {
		for _, r := range rs {
			for _, pe := range r.peers {
				if pe.nsSel != nil {
					return true
				}
			}
		}
	}
	return false
}

// SetPolicy adds or replaces a policy. A policy that does not compile (the
// API server validates them, so only a newer API's fields can cause
// this) still isolates the pods it selects, with no allowed peer: it
// fails closed. The error says why.
func (e *Engine) SetPolicy(np *networkingv1.NetworkPolicy) error {
	pol, err := compile(np, &e.sels)
	if err != nil {
		pol = &policy{namespace: np.Namespace, name: np.Name, selector: labels.Everything(), ingress: true, egress: true}
		if s, serr := compileSelector(np); serr == nil {
			pol.selector = s
		}
	}
	k := np.Namespace + "/" + np.Name
	old := e.policies[k]
	// Only this policy's polLocal entry changes: policyDelta keeps the
	// kept weights of its signatures in step (a pod it dirties is
	// recomputed by a Compute, which drops them all).
	// The local pods the old version selected lose its contributions
	// (counted against the current pods, as they were added: a peer's
	// change keeps them current, see podChanged).
	for l := range e.polLocal[k] {
		e.policyDelta(l, k, old, -1)
	}
	if old != nil {
		e.ungroup(old)
	}
	e.policies[k] = pol
	e.group(pol)
	if e.polByNS[pol.namespace] == nil {
		e.polByNS[pol.namespace] = map[string]*policy{}
	}
	e.polByNS[pol.namespace][pol.name] = pol
	if len(e.contrib) == 0 {
		// No local pod has computed contributions (a cold start's lists,
		// before the first Compute): every active local pod is dirty
		// already, so there is nothing to add to.
		return err
	}
	for _, p := range e.localNS[pol.namespace] {
		if pol.selector.Matches(labels.Set(p.Labels)) {
			e.policyDelta(p.Key(), k, pol, 1)
		}
	}
	return err
}

// policyDelta adds (sign 1) or takes out (-1) what policy pol (key pk)
// contributes to local pod l, when l's contributions are current;
// otherwise l is recomputed by the next Compute. A change of one policy
// thus costs what that policy allows the pods it selects, not what their
// other policies allow.
func (e *Engine) policyDelta(l, pk string, pol *policy, sign int32) {
	c, lp := e.contrib[l], e.pods[l]
	if e.dirty[l] || c == nil || pol == nil || !e.local(lp) || !lp.active() {
		e.dirty[l] = true
		return
	}
	if sign > 0 {
		if e.polLocal[pk] == nil {
			e.polLocal[pk] = map[string]bool{}
		}
		e.polLocal[pk][l] = true
		e.podPols[l] = append(e.podPols[l], pk)
	} else {
		if locals := e.polLocal[pk]; locals != nil {
			delete(locals, l)
			if len(locals) == 0 {
				delete(e.polLocal, pk)
			}
		}
		if i := slices.Index(e.podPols[l], pk); i >= 0 {
			e.podPols[l] = slices.Delete(e.podPols[l], i, i+1)
		}
	}
	e.weightDelta(pol, l, sign)
	counter := func(set map[Allow]int32, flip map[Allow]bool) func(Allow) {
		return func(a Allow) { count(set, flip, a, sign) }
	}
	if pol.ingress {
		c.isoIn += sign
		for _, ru := range pol.inRules {
			e.addRule(counter(c.in, flips(&c.flipIn)), pol.namespace, ru, lp, false)
		}
	}
	if pol.egress {
		c.isoEg += sign
		for _, ru := range pol.egRules {
			e.addRule(counter(c.eg, flips(&c.flipEg)), pol.namespace, ru, lp, true)
		}
	}
	e.deltas[l] = true
}

// DeletePolicy forgets a policy.
func (e *Engine) DeletePolicy(namespace, name string) {
	k := namespace + "/" + name
	if _, ok := e.policies[k]; !ok {
		return
	}
	for l := range e.polLocal[k] {
		e.policyDelta(l, k, e.policies[k], -1)
	}
	e.ungroup(e.policies[k])
	delete(e.policies, k)
	delete(e.polByNS[namespace], name)
	if len(e.polByNS[namespace]) == 0 {
		delete(e.polByNS, namespace)
	}
	delete(e.polLocal, k)
}

// Dirty reports how many local pods wait for Compute (to be recomputed,
// or patched after a delta).
func (e *Engine) Dirty() int { return len(e.dirty) + len(e.deltas) }

// Rules returns the last computed rules of a local pod (nil: none).
func (e *Engine) Rules(key string) *Rules { return e.rules[key] }

// All returns the last computed rules of every local pod.
func (e *Engine) All() map[string]*Rules { return maps.Clone(e.rules) }

// Compute recomputes the dirty local pods and returns those whose rules
// changed: key -> new rules, nil when the pod is gone, not local or has no
// address.
func (e *Engine) Compute() map[string]*Rules {
	out := map[string]*Rules{}
	if len(e.dirty) > 0 {
		e.weights = nil // a recomputation rewrites polLocal
	}
	e.memo = map[string][]*Pod{}
	defer func() { e.memo = nil }()
	// Local pods alike in all the engine's computation reads of them
	// (namespace, labels, named ports: replicas of one workload) share
	// one computation: the others get copies of its counts.
	var classes map[string]string // class -> the pod computed
	if len(e.dirty) > 1 {
		classes = map[string]string{}
	}
	for k := range e.dirty {
		p := e.pods[k]
		var r *Rules
		for _, pk := range e.podPols[k] {
			if locals := e.polLocal[pk]; locals != nil {
				delete(locals, k)
				if len(locals) == 0 {
					delete(e.polLocal, pk)
				}
			}
		}
		delete(e.podPols, k)
		delete(e.contrib, k)
		if e.local(p) && p.active() {
			var ck string
			if classes != nil {
				ck = classKey(p)
			}
			if rep, ok := classes[ck]; ok {
				r = e.computeLike(p, rep)
			} else {
				r = e.compute(p)
				if classes != nil {
					classes[ck] = k
				}
			}
		}
		if old := e.rules[k]; !old.Equal(r) {
			out[k] = r
		}
		if r == nil {
			delete(e.rules, k)
		} else {
			e.rules[k] = r
		}
	}
	// Local pods that shared a list before the deltas (a class's, see
	// computeLike) and whose flips agree share the patched list too: a
	// peer's change builds one new list per class, not one per pod.
	var pm patchMemo
	var patched []*podContrib
	for k := range e.deltas {
		c, old := e.contrib[k], e.rules[k]
		if e.dirty[k] || c == nil || old == nil {
			continue
		}
		in, inCh := pm.patch(old.Ingress, c.isoIn > 0, c.in, c.flipIn)
		eg, egCh := pm.patch(old.Egress, c.isoEg > 0, c.eg, c.flipEg)
		patched = append(patched, c)
		if !inCh && !egCh {
			continue
		}
		r := &Rules{IP: old.IP, Ingress: in, Egress: eg}
		out[k] = r
		e.rules[k] = r
	}
	// The flips are spent (pm, which holds them, is done): emptied for
	// the next change rather than made anew, unless large (a big change
	// would keep its map's room).
	for _, c := range patched {
		c.flipIn, c.flipEg = reuse(c.flipIn), reuse(c.flipEg)
	}
	e.stats.Recomputed, e.stats.Patched, e.stats.Changed = len(e.dirty), len(patched), len(out)
	e.last, e.stats = e.stats, Stats{}
	clear(e.deltas)
	clear(e.dirty)
	return out
}

func (e *Engine) compute(l *Pod) *Rules {
	r := &Rules{IP: l.IP}
	var hin, heg int // size hints: the last rules' lengths
	if old := e.rules[l.Key()]; old != nil {
		hin, heg = old.Ingress.Len(), old.Egress.Len()
	}
	in, eg := make(map[Allow]int32, hin), make(map[Allow]int32, heg)
	lk := l.Key()
	c := &podContrib{in: in, eg: eg}
	for _, g := range e.polBySel[l.Namespace] {
		if !g.sel.Matches(labels.Set(l.Labels)) {
			continue
		}
		for name, pol := range g.pols {
			e.addPolicyTo(l, lk, name, pol, c)
		}
	}
	r.Ingress.Isolated, r.Egress.Isolated = c.isoIn > 0, c.isoEg > 0
	e.contrib[lk] = c
	r.Ingress.Base = finish(&r.Ingress, in)
	r.Egress.Base = finish(&r.Egress, eg)
	return r
}

// classKey is what compute reads of local pod p besides the engine's
// state: its namespace, labels and named ports.
func classKey(p *Pod) string {
	ks := slices.Sorted(maps.Keys(p.Labels))
	b := make([]byte, 0, 64)
	b = append(b, p.Namespace...)
	for _, k := range ks {
		b = append(b, 0)
		b = append(b, k...)
		b = append(b, 0)
		b = append(b, p.Labels[k]...)
	}
	b = append(b, 1)
	for _, np := range p.Ports {
		b = append(b, np.Name...)
		b = append(b, 0, byte(np.Proto), byte(np.Port>>8), byte(np.Port))
	}
	return string(b)
}

// computeLike gives local pod l the rules and contributions of rep, a
// local pod of l's class computed in this Compute: the same policies, the
// same counts (copied, as deltas change each pod's own), the same allows
// (shared: rules are never changed in place).
func (e *Engine) computeLike(l *Pod, rep string) *Rules {
	lk := l.Key()
	c0, r0 := e.contrib[rep], e.rules[rep]
	for _, pk := range e.podPols[rep] {
		if e.polLocal[pk] == nil {
			e.polLocal[pk] = map[string]bool{}
		}
		e.polLocal[pk][lk] = true
	}
	e.podPols[lk] = slices.Clone(e.podPols[rep])
	e.contrib[lk] = &podContrib{isoIn: c0.isoIn, isoEg: c0.isoEg, in: maps.Clone(c0.in), eg: maps.Clone(c0.eg)}
	return &Rules{IP: l.IP, Ingress: r0.Ingress, Egress: r0.Egress}
}

// addPolicyTo adds what policy pol allows to local pod l's contributions.
func (e *Engine) addPolicyTo(l *Pod, lk, name string, pol *policy, c *podContrib) {
	pk := l.Namespace + "/" + name
	if e.polLocal[pk] == nil {
		e.polLocal[pk] = map[string]bool{}
	}
	e.polLocal[pk][lk] = true
	e.podPols[lk] = append(e.podPols[lk], pk)
	inc := func(set map[Allow]int32) func(Allow) { return func(a Allow) { set[a]++ } }
	if pol.ingress {
		c.isoIn++
		for _, ru := range pol.inRules {
			e.addRule(inc(c.in), pol.namespace, ru, l, false)
		}
	}
	if pol.egress {
		c.isoEg++
		for _, ru := range pol.egRules {
			e.addRule(inc(c.eg), pol.namespace, ru, l, true)
		}
	}
}

// selGroup is the policies of one namespace that share a podSelector.
type selGroup struct {
	sel  labels.Selector
	pols map[string]*policy // by name
}

// sigKey is the bySig key of pol: its peer signature, or its own key
// when it has none (a policy that did not compile names no peer).
func sigKey(pol *policy) string {
	if pol.peerSig == "" {
		return "\x00" + pol.namespace + "/" + pol.name
	}
	return pol.peerSig
}

func (e *Engine) group(pol *policy) {
	sk := sigKey(pol)
	if e.bySig[sk] == nil {
		e.bySig[sk] = map[string]*policy{}
	}
	e.bySig[sk][pol.namespace+"/"+pol.name] = pol
	gs := e.polBySel[pol.namespace]
	if gs == nil {
		gs = map[string]*selGroup{}
		e.polBySel[pol.namespace] = gs
	}
	key := pol.selector.String()
	g := gs[key]
	if g == nil {
		g = &selGroup{sel: pol.selector, pols: map[string]*policy{}}
		gs[key] = g
	}
	g.pols[pol.name] = pol
}

func (e *Engine) ungroup(pol *policy) {
	if pol == nil {
		return
	}
	sk := sigKey(pol)
	if m := e.bySig[sk]; m != nil {
		delete(m, pol.namespace+"/"+pol.name)
		if len(m) == 0 {
			delete(e.bySig, sk)
		}
	}
	gs := e.polBySel[pol.namespace]
	key := pol.selector.String()
	if g := gs[key]; g != nil {
		delete(g.pols, pol.name)
		if len(g.pols) == 0 {
			delete(gs, key)
		}
	}
	if len(gs) == 0 {
		delete(e.polBySel, pol.namespace)
	}
}

// allowAll is the Allow of a rule without peers and ports.
var allowAll = Allow{PeerLo: anyLo, PeerHi: anyHi}

// patchMemo remembers, during one Compute, the directions patch built
// from each old one, so that local pods which shared a list and got the
// same flips share the result (see Compute).
type patchMemo map[policyrule.ListID][]patched

// patched is one direction patch built: with flip and the counts set,
// the result d.
type patched struct {
	flip map[Allow]bool
	set  map[Allow]int32
	d    Dir
}

// patch is the package's patch, sharing the result with an earlier
// pod's when that pod's old list was the same and its flips crossed
// the same allows to the same side. It reports whether the direction
// changed.
func (m *patchMemo) patch(old Dir, iso bool, set map[Allow]int32, flip map[Allow]bool) (Dir, bool) {
	if len(flip) == 0 && iso == old.Isolated && (!iso || set[allowAll] == 0) {
		return old, false
	}
	// Only the path that keeps the old list's isolation and applies the
	// flips to it depends on nothing but the flips.
	fast := iso && old.Isolated && set[allowAll] == 0
	id := old.ID()
	if fast {
		for _, p := range (*m)[id] {
			if sameFlips(p.flip, p.set, flip, set) {
				return p.d, true
			}
		}
	}
	d := patch(old, iso, set, flip)
	changed := !d.Equal(old)
	if fast && changed {
		if *m == nil {
			*m = patchMemo{}
		}
		(*m)[id] = append((*m)[id], patched{flip: flip, set: set, d: d})
	}
	return d, changed
}

// sameFlips reports whether flips f (counts s) and g (counts t) name the
// same allows, each now on the same side of zero.
func sameFlips(f map[Allow]bool, s map[Allow]int32, g map[Allow]bool, t map[Allow]int32) bool {
	if len(f) != len(g) {
		return false
	}
	for a := range f {
		if _, ok := g[a]; !ok || (s[a] > 0) != (t[a] > 0) {
			return false
		}
	}
	return true
}

// patch returns the direction whose last computed state is old, now
// isolated iso with counts set, where only the Allows in flip may have
// changed: old with the flips applied as a new overlay on its list
// (policyrule.Dir.With: O(overlay + flips log flips), the old list's
// Base shared, not copied), or, when isolation or allow-all changed, a
// full finish.
func patch(old Dir, iso bool, set map[Allow]int32, flip map[Allow]bool) Dir {
	d := Dir{Isolated: iso}
	if !iso || set[allowAll] > 0 || !old.Isolated {
		d.Base = finish(&d, set)
		return d
	}
	if len(flip) == 0 {
		return old
	}
	// The flips that changed membership, in one buffer: additions from
	// its start, deletions from its end.
	buf := make([]Allow, len(flip))
	i, j := 0, len(buf)
	for a := range flip {
		was, now := old.Has(a), set[a] > 0
		switch {
		case now && !was:
			buf[i] = a
			i++
		case was && !now:
			j--
			buf[j] = a
		}
	}
	add, del := buf[:i], buf[j:]
	if len(add) == 0 && len(del) == 0 {
		return old
	}
	slices.SortFunc(add, policyrule.Compare)
	slices.SortFunc(del, policyrule.Compare)
	return old.With(add, del)
}

func finish(d *Dir, set map[Allow]int32) []Allow {
	if !d.Isolated || set[allowAll] > 0 {
		d.Isolated = false
		return nil
	}
	out := make([]Allow, 0, len(set))
	for a := range set {
		out = append(out, a)
	}
	slices.SortFunc(out, policyrule.Compare)
	return out
}

// addRule adds what rule ru of a policy in namespace polNS allows for
// local pod l.
func (e *Engine) addRule(count func(Allow), polNS string, ru rule, l *Pod, egress bool) {
	// The peers: address ranges and pods.
	var ranges [][2]Addr4
	var pods []*Pod
	if ru.allPeers {
		ranges = append(ranges, [2]Addr4{anyLo, anyHi})
	}
	for _, pe := range ru.peers {
		if pe.block {
			ranges = append(ranges, pe.ranges...)
			continue
		}
		pods = e.appendPeers(pods, polNS, pe)
	}
	add := func(lo, hi Addr4, pr Proto, plo, phi uint16) {
		count(Allow{PeerLo: lo, PeerHi: hi, Proto: pr, PortLo: plo, PortHi: phi})
	}
	if ru.allPorts {
		for _, rg := range ranges {
			add(rg[0], rg[1], 0, 0, 0)
		}
		for _, p := range pods {
			add(A4(p.IP), A4(p.IP), 0, 0, 0)
		}
		return
	}
	for _, pt := range ru.ports {
		if pt.name == "" {
			for _, rg := range ranges {
				add(rg[0], rg[1], pt.proto, pt.lo, pt.hi)
			}
			for _, p := range pods {
				add(A4(p.IP), A4(p.IP), pt.proto, pt.lo, pt.hi)
			}
			continue
		}
		if !egress { // resolved on the destination: the local pod
			n, ok := l.namedPort(pt.name, pt.proto)
			if !ok {
				continue
			}
			for _, rg := range ranges {
				add(rg[0], rg[1], pt.proto, n, n)
			}
			for _, p := range pods {
				add(A4(p.IP), A4(p.IP), pt.proto, n, n)
			}
			continue
		}
		// Egress: resolved on each destination pod; a range reaches the
		// pods whose addresses it holds.
		for _, p := range pods {
			if n, ok := p.namedPort(pt.name, pt.proto); ok {
				add(A4(p.IP), A4(p.IP), pt.proto, n, n)
			}
		}
		if len(ranges) > 0 {
			for _, p := range e.pods {
				if !p.active() || !inRanges(ranges, A4(p.IP)) {
					continue
				}
				if n, ok := p.namedPort(pt.name, pt.proto); ok {
					add(A4(p.IP), A4(p.IP), pt.proto, n, n)
				}
			}
		}
	}
}

func (e *Engine) appendPeers(out []*Pod, polNS string, pe peer) []*Pod {
	var key string
	if e.memo != nil {
		key = polNS + "\x00" + selString(pe.pods) + "\x00" + selString(pe.nsSel)
		if m, ok := e.memo[key]; ok {
			return append(out, m...)
		}
		start := len(out)
		defer func() { e.memo[key] = out[start:len(out):len(out)] }()
	}
	scan := func(ns string) {
		for _, p := range e.byNS[ns] {
			if p.active() && (pe.pods == nil || pe.pods.Matches(labels.Set(p.Labels))) {
				out = append(out, p)
			}
		}
	}
	if pe.nsSel == nil {
		scan(polNS)
		return out
	}
	for ns := range e.byNS {
		if pe.nsSel.Matches(e.nsLabels[ns]) {
			scan(ns)
		}
	}
	return out
}

func inRanges(rs [][2]Addr4, a Addr4) bool {
	for _, r := range rs {
		if r[0] <= a && a <= r[1] {
			return true
		}
	}
	return false
}

func selString(s labels.Selector) string {
	if s == nil {
		return "<nil>"
	}
	return s.String()
}
