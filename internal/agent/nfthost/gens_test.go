package nfthost

import (
	"context"
	"errors"
	"testing"

	"github.com/google/nftables"
	"sigs.k8s.io/knftables"
)

// setLister is a Reader whose table holds the given sets.
type setLister struct {
	Recorder
	names []string
}

func (l *setLister) GetSets(t *nftables.Table) ([]*nftables.Set, error) {
	var out []*nftables.Set
	for _, n := range l.names {
		out = append(out, &nftables.Set{Table: t, Name: n})
	}
	return out, nil
}

var testDefs = []SetDef{
	{Name: "svc", IsMap: true, Decl: "ipv4_addr : mark"},
	{Name: "addrs", Decl: "ipv4_addr"},
}

func TestGenerationsDetect(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sets  []string
		want  string
		first string // kernel name of set 0 afterwards
	}{
		{"empty table", nil, "a", "svc-a"},
		{"a", []string{"svc-a", "addrs-a"}, "a", "svc-a"},
		{"b", []string{"svc-b", "addrs-b"}, "b", "svc-b"},
		// A rebuild that crashed before its switch left both: the rules
		// still use a.
		{"both", []string{"svc-a", "addrs-a", "svc-b", "addrs-b"}, "a", "svc-a"},
		{"other sets only", []string{"node-addrs"}, "a", "svc-a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGenerations(Inet("kgt"), testDefs)
			if err := g.Detect(&setLister{names: tc.sets}); err != nil {
				t.Fatal(err)
			}
			if g.Current() != tc.want || g.Set(0).Name != tc.first || !g.Set(0).IsMap || g.Set(1).IsMap {
				t.Fatalf("current %q, set 0 %+v; want %q, %q", g.Current(), g.Set(0), tc.want, tc.first)
			}
		})
	}
}

func TestGenerationsMissing(t *testing.T) {
	g := NewGenerations(Inet("kgt"), testDefs)
	g.Use("b")
	sets := func(names ...string) []*nftables.Set {
		var out []*nftables.Set
		for _, n := range names {
			out = append(out, &nftables.Set{Name: n})
		}
		return out
	}
	for _, tc := range []struct {
		have []string
		want string
	}{
		{[]string{"svc-b", "addrs-b", "affinity"}, ""},
		{[]string{"svc-b", "addrs-a"}, "addrs-b"},
		{[]string{"svc-a", "addrs-a"}, "svc-b"},
		{nil, "svc-b"},
	} {
		if got := g.Missing(sets(tc.have...)); got != tc.want {
			t.Errorf("Missing(%v) = %q, want %q", tc.have, got, tc.want)
		}
	}
}

// TestGenerationsRebuild: a rebuild prepares the other generation's sets
// in one transaction, fills them while Set names them, and stays on it
// only when the switch succeeds; the switch drops the old generation.
func TestGenerationsRebuild(t *testing.T) {
	ctx := t.Context()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name             string
		fillErr, swErr   error
		want             string
		wantSets, noSets []string
	}{
		{"ok", nil, nil, "b", []string{"svc-b", "addrs-b"}, []string{"svc-a", "addrs-a"}},
		{"fill fails", boom, nil, "a", []string{"svc-a", "addrs-a"}, nil},
		{"switch fails", nil, boom, "a", []string{"svc-a", "addrs-a"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nft := knftables.NewFake(knftables.InetFamily, "kgt")
			g := NewGenerations(Inet("kgt"), testDefs)
			tx := nft.NewTransaction()
			tx.Add(&knftables.Table{})
			for _, o := range g.Objects("a") {
				tx.Add(o)
			}
			if err := nft.Run(ctx, tx); err != nil {
				t.Fatal(err)
			}
			runs := 0
			run := func(ctx context.Context, tx *knftables.Transaction) error {
				runs++
				return nft.Run(ctx, tx)
			}
			var filled string
			fill := func() error {
				filled = g.Set(0).Name
				return tc.fillErr
			}
			switchTo := func(gen, old string) error {
				if gen != "b" || old != "a" {
					t.Errorf("switchTo(%q, %q), want (b, a)", gen, old)
				}
				if tc.swErr != nil {
					return tc.swErr
				}
				tx := nft.NewTransaction()
				g.Drop(tx, old)
				return nft.Run(ctx, tx)
			}
			err := g.Rebuild(ctx, nft.NewTransaction, run, fill, switchTo)
			if want := tc.fillErr != nil || tc.swErr != nil; (err != nil) != want || err != nil && !errors.Is(err, boom) {
				t.Fatalf("Rebuild: %v", err)
			}
			if filled != "svc-b" || runs != 1 || g.Current() != tc.want || g.Set(0).Name != "svc-"+tc.want {
				t.Fatalf("filled %q after %d runs; current %q (set 0 %q), want svc-b, 1, %q", filled, runs, g.Current(), g.Set(0).Name, tc.want)
			}
			for _, n := range tc.wantSets {
				if nft.Table.Maps[n] == nil && nft.Table.Sets[n] == nil {
					t.Errorf("set %s missing", n)
				}
			}
			for _, n := range tc.noSets {
				if nft.Table.Maps[n] != nil || nft.Table.Sets[n] != nil {
					t.Errorf("set %s left", n)
				}
			}
		})
	}
}
