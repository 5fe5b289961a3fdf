package nfthost

import (
	"context"
	"fmt"

	"github.com/google/nftables"
	"sigs.k8s.io/knftables"
)

// SetDef declares one set (or map) of a datapath's element data.
type SetDef struct {
	// Name is the base name; in the kernel the set is Name-<generation>.
	Name string
	// IsMap tells a map (key : data) from a set.
	IsMap bool
	// Decl is the nft type, of the key and for a map of its data
	// ("ipv4_addr . inet_service : mark").
	Decl string
}

// Generations keeps a datapath's data sets in two generations, "a" and
// "b", of which the rules use one: a rebuild fills the unused one from
// scratch and then, in one nft transaction, points the rules at it and
// deletes the other, so that traffic sees the old state or the new one,
// never a mix, and no stale element survives (without reading any
// back). lbpath uses it for its load-balancer and floating-IP sets.
//
// A Generations is not safe for concurrent use; its datapath guards it
// with its own lock.
type Generations struct {
	tbl  *nftables.Table
	defs []SetDef
	cur  string
	sets []*nftables.Set
}

// NewGenerations returns the generations of defs in table tbl, the
// current one "a" (Detect finds the one in the kernel).
func NewGenerations(tbl *nftables.Table, defs []SetDef) *Generations {
	g := &Generations{tbl: tbl, defs: defs, sets: make([]*nftables.Set, len(defs))}
	g.Use("a")
	return g
}

// Current is the generation the rules use ("a" or "b").
func (g *Generations) Current() string { return g.cur }

// Other is the generation the rules do not use.
func (g *Generations) Other() string {
	if g.cur == "a" {
		return "b"
	}
	return "a"
}

// Use makes gen the current generation: Set then returns its sets.
func (g *Generations) Use(gen string) {
	g.cur = gen
	for i, d := range g.defs {
		g.sets[i] = &nftables.Set{Table: g.tbl, Name: g.Name(i, gen), IsMap: d.IsMap}
	}
}

// Name is the kernel name of set i (an index into the defs) in gen.
func (g *Generations) Name(i int, gen string) string { return g.defs[i].Name + "-" + gen }

// Set is set i of the current generation, for element reads and writes.
func (g *Generations) Set(i int) *nftables.Set { return g.sets[i] }

// Objects are the sets of generation gen with their types, for a
// knftables transaction (Flush and Delete need only the names).
func (g *Generations) Objects(gen string) []knftables.Object {
	out := make([]knftables.Object, 0, len(g.defs))
	for i, d := range g.defs {
		if d.IsMap {
			out = append(out, &knftables.Map{Name: g.Name(i, gen), Type: d.Decl})
		} else {
			out = append(out, &knftables.Set{Name: g.Name(i, gen), Type: d.Decl})
		}
	}
	return out
}

// Drop adds to tx the deletion of generation gen's sets (each added
// first: deleting what a crash already removed would fail the
// transaction). The transaction that points the rules away from gen
// carries it.
func (g *Generations) Drop(tx *knftables.Transaction, gen string) {
	for _, o := range g.Objects(gen) {
		tx.Add(o)
		tx.Delete(o)
	}
}

// Detect reads the table's sets (through netlink: nft would load every
// element first) and makes current the generation the kernel holds: "b"
// when the first set's "b" exists and its "a" does not, else "a". A
// missing table counts as "a".
func (g *Generations) Detect(r Reader) error {
	sets, err := r.GetSets(g.tbl)
	if err != nil {
		return fmt.Errorf("list sets of %s: %w", g.tbl.Name, err)
	}
	a, b := false, false
	for _, s := range sets {
		a = a || s.Name == g.Name(0, "a")
		b = b || s.Name == g.Name(0, "b")
	}
	if b && !a {
		g.Use("b")
	} else {
		g.Use("a")
	}
	return nil
}

// Missing returns the name of the first set of the current generation
// absent from sets (the table's, as listed), or "" when all are there.
func (g *Generations) Missing(sets []*nftables.Set) string {
	names := make(map[string]bool, len(sets))
	for _, s := range sets {
		names[s.Name] = true
	}
	for i := range g.defs {
		if n := g.Name(i, g.cur); !names[n] {
			return n
		}
	}
	return ""
}

// Rebuild fills the unused generation and switches the rules to it:
// one nft transaction (made by newTx, run by run) adds and empties the
// unused generation's sets; fill writes every element into them (Set
// returns them meanwhile); switchTo must point the rules at gen and
// Drop old in one transaction. If fill or switchTo fails, the current
// generation is old again (its sets and rules untouched), and a later
// Rebuild refills the other one from scratch. The errors of fill and
// switchTo are returned as they are.
func (g *Generations) Rebuild(ctx context.Context, newTx func() *knftables.Transaction,
	run func(context.Context, *knftables.Transaction) error, fill func() error, switchTo func(gen, old string) error,
) error {
	old, gen := g.cur, g.Other()
	tx := newTx()
	for _, o := range g.Objects(gen) {
		tx.Add(o)
		tx.Flush(o)
	}
	if err := run(ctx, tx); err != nil {
		return fmt.Errorf("nftables: table %s: prepare sets %s: %w", g.tbl.Name, gen, err)
	}
	g.Use(gen)
	err := fill()
	if err == nil {
		err = switchTo(gen, old)
	}
	if err != nil {
		g.Use(old)
		return err
	}
	return nil
}
