package ipam_test

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"

	"kurma.dev/kurma/internal/controller/ipam"
	"kurma.dev/kurma/pkg/kerrors"
)

func TestNewSubnet(t *testing.T) {
	tests := []struct {
		name     string
		cidr     string
		ver      int
		gw       string
		pools    []ipam.Pool
		wantErr  error
		wantGW   string
		capacity int64
	}{
		{"v4 /24 defaults", "10.1.2.0/24", 4, "", nil, nil, "10.1.2.1", 253},
		{"v4 derived version", "10.1.2.0/24", 0, "", nil, nil, "10.1.2.1", 253},
		{"v4 custom gw", "10.1.2.0/24", 4, "10.1.2.254", nil, nil, "10.1.2.254", 253},
		{"v4 pool", "10.1.2.0/24", 4, "", []ipam.Pool{{"10.1.2.10", "10.1.2.19"}}, nil, "10.1.2.1", 10},
		{"v4 pool with gw inside", "10.1.2.0/24", 4, "10.1.2.10", []ipam.Pool{{"10.1.2.10", "10.1.2.19"}}, nil, "10.1.2.10", 9},
		{"v4 /30", "10.0.0.0/30", 4, "", nil, nil, "10.0.0.1", 1},
		{"v6 /64", "fd00::/64", 6, "", nil, nil, "fd00::1", ipam.MaxAddresses - 2},
		{"v6 /120", "fd00::/120", 6, "", nil, nil, "fd00::1", 254},
		{"host bits", "10.1.2.3/24", 4, "", nil, kerrors.Invalid, "", 0},
		{"garbage", "nope", 4, "", nil, kerrors.Invalid, "", 0},
		{"version mismatch", "10.0.0.0/24", 6, "", nil, kerrors.Invalid, "", 0},
		{"gw outside", "10.0.0.0/24", 4, "10.0.1.1", nil, kerrors.Invalid, "", 0},
		{"gw is network", "10.0.0.0/24", 4, "10.0.0.0", nil, kerrors.Invalid, "", 0},
		{"gw is broadcast", "10.0.0.0/24", 4, "10.0.0.255", nil, kerrors.Invalid, "", 0},
		{"pool reversed", "10.0.0.0/24", 4, "", []ipam.Pool{{"10.0.0.9", "10.0.0.2"}}, kerrors.Invalid, "", 0},
		{"pool has broadcast", "10.0.0.0/24", 4, "", []ipam.Pool{{"10.0.0.9", "10.0.0.255"}}, kerrors.Invalid, "", 0},
		{"pools overlap", "10.0.0.0/24", 4, "", []ipam.Pool{{"10.0.0.2", "10.0.0.9"}, {"10.0.0.9", "10.0.0.20"}}, kerrors.Invalid, "", 0},
		{"pool bad addr", "10.0.0.0/24", 4, "", []ipam.Pool{{"x", "10.0.0.20"}}, kerrors.Invalid, "", 0},
		{"v4 /32 no hosts beyond itself", "10.0.0.7/32", 4, "", nil, nil, "10.0.0.7", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ipam.New(tt.cidr, tt.ver, tt.gw, tt.pools)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("New = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Gateway().String() != tt.wantGW {
				t.Errorf("gateway = %s, want %s", s.Gateway(), tt.wantGW)
			}
			if s.Capacity() != tt.capacity {
				t.Errorf("capacity = %d, want %d", s.Capacity(), tt.capacity)
			}
		})
	}
}

func TestRequest(t *testing.T) {
	s, err := ipam.New("192.168.0.0/24", 4, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		addr string
		want error
		off  int64
	}{
		{"192.168.0.5", nil, 5},
		{"192.168.0.254", nil, 254},
		{"192.168.0.1", kerrors.Conflict, 0},
		{"192.168.0.0", kerrors.Invalid, 0},
		{"192.168.0.255", kerrors.Invalid, 0},
		{"192.168.1.5", kerrors.Invalid, 0},
		{"fd00::1", kerrors.Invalid, 0},
		{"bogus", kerrors.Invalid, 0},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			off, err := s.Request(tt.addr)
			if tt.want != nil {
				if !errors.Is(err, tt.want) {
					t.Fatalf("Request = %v, want %v", err, tt.want)
				}
				return
			}
			if err != nil || off != tt.off || s.Addr(off).String() != tt.addr {
				t.Fatalf("Request = %d, %v; want %d", off, err, tt.off)
			}
		})
	}
}

// exhaust reserves and commits until the tracker is empty.
func exhaust(t *testing.T, tr *ipam.Tracker) map[netip.Addr]bool {
	t.Helper()
	got := map[netip.Addr]bool{}
	for {
		off, ok := tr.Reserve()
		if !ok {
			return got
		}
		a := tr.Subnet().Addr(off)
		if got[a] {
			t.Fatalf("address %s handed out twice", a)
		}
		got[a] = true
		tr.Commit(off)
	}
}

func TestTrackerNeverHandsOutReserved(t *testing.T) {
	tests := []struct {
		cidr  string
		gw    string
		pools []ipam.Pool
	}{
		{"10.0.0.0/24", "", nil},
		{"10.0.0.0/22", "10.0.2.1", nil},
		{"10.0.0.0/24", "", []ipam.Pool{{"10.0.0.100", "10.0.0.110"}, {"10.0.0.2", "10.0.0.3"}}},
		{"fd00::/116", "", nil},
		{"10.0.0.0/18", "", nil}, // spans several blocks
	}
	for _, tt := range tests {
		t.Run(tt.cidr, func(t *testing.T) {
			s, err := ipam.New(tt.cidr, 0, tt.gw, tt.pools)
			if err != nil {
				t.Fatal(err)
			}
			got := exhaust(t, ipam.NewTracker(s))
			if int64(len(got)) != s.Capacity() {
				t.Fatalf("handed out %d, capacity %d", len(got), s.Capacity())
			}
			p := s.Prefix()
			if got[s.Gateway()] || got[p.Addr()] {
				t.Fatalf("gateway or network address handed out")
			}
			for a := range got {
				if !p.Contains(a) {
					t.Fatalf("%s outside %s", a, p)
				}
				if p.Addr().Is4() && a == s.Addr(int64(1)<<(32-p.Bits())-1) {
					t.Fatalf("broadcast %s handed out", a)
				}
			}
		})
	}
}

func TestTrackerReleaseReuseAndClaim(t *testing.T) {
	s, _ := ipam.New("10.9.0.0/29", 4, "", nil) // hosts .2-.6 (gw .1)
	tr := ipam.NewTracker(s)
	got := exhaust(t, tr)
	if len(got) != 5 {
		t.Fatalf("got %d addresses", len(got))
	}
	off, _ := s.Request("10.9.0.4")
	if err := tr.Claim(off); !errors.Is(err, kerrors.Conflict) {
		t.Fatalf("claim of used = %v", err)
	}
	tr.Release(off)
	if err := tr.Claim(off); err != nil {
		t.Fatalf("claim of released: %v", err)
	}
	if _, ok := tr.Reserve(); ok {
		t.Fatal("pending claim handed out again")
	}
	tr.Abort(off, false)
	if o, ok := tr.Reserve(); !ok || o != off {
		t.Fatalf("released address not reused: %d %v", o, ok)
	}
}

func TestTrackerLoadAndConcurrency(t *testing.T) {
	s, _ := ipam.New("10.0.0.0/20", 4, "", nil)
	tr := ipam.NewTracker(s)
	bm := make([]byte, ipam.BlockBytes)
	for i := range 256 {
		bm[i] = 0xff // first 2048 offsets used
	}
	tr.Load(0, bm)
	var mu sync.Mutex
	seen := map[int64]bool{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				off, ok := tr.Reserve()
				if !ok {
					return
				}
				mu.Lock()
				if seen[off] || off < 2048 {
					t.Errorf("bad or duplicate offset %d", off)
				}
				seen[off] = true
				mu.Unlock()
				tr.Commit(off)
			}
		})
	}
	wg.Wait()
	if len(seen) != 4096-2048-1 { // minus broadcast
		t.Fatalf("allocated %d", len(seen))
	}
}

func TestMAC(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		m := ipam.RandomMAC()
		p, err := ipam.ParseMAC(m)
		if err != nil || p != m || seen[m] {
			t.Fatalf("bad or repeated MAC %s: %v", m, err)
		}
		seen[m] = true
	}
	for _, bad := range []string{"", "01:00:5e:00:00:01", "00:00:00:00:00:00", "zz:00:00:00:00:00", "00:11:22:33:44:55:66:77"} {
		if _, err := ipam.ParseMAC(bad); !errors.Is(err, kerrors.Invalid) {
			t.Errorf("ParseMAC(%q) = %v", bad, err)
		}
	}
	for range 1000 {
		if v := ipam.RandomVNI(); v == 0 || v > ipam.MaxVNI {
			t.Fatalf("VNI %d out of range", v)
		}
	}
}

func TestMACGen(t *testing.T) {
	g := ipam.NewMACGen()
	seen := map[string]bool{}
	for range 5000 {
		m := g.Next()
		p, err := ipam.ParseMAC(m)
		if err != nil || p != m || seen[m] {
			t.Fatalf("bad or repeated MAC %s: %v", m, err)
		}
		if hw, _ := net.ParseMAC(m); hw[0]&0x03 != 0x02 {
			t.Fatalf("%s is not locally administered unicast", m)
		}
		seen[m] = true
	}
}

func FuzzNewSubnet(f *testing.F) {
	f.Add("10.0.0.0/24", "", "10.0.0.10", "10.0.0.20", "10.0.0.15")
	f.Add("fd00::/64", "fd00::1", "", "", "fd00::5")
	f.Add("1.2.3.4/32", "", "", "", "1.2.3.4")
	f.Fuzz(func(t *testing.T, cidr, gw, ps, pe, req string) {
		var pools []ipam.Pool
		if ps != "" || pe != "" {
			pools = []ipam.Pool{{ps, pe}}
		}
		s, err := ipam.New(cidr, 0, gw, pools)
		if err != nil {
			return
		}
		if off, err := s.Request(req); err == nil {
			if !s.Prefix().Contains(s.Addr(off)) {
				t.Fatalf("requested offset %d outside prefix", off)
			}
		}
		tr := ipam.NewTracker(s)
		for range 3 {
			off, ok := tr.Reserve()
			if !ok {
				break
			}
			if !s.Allocatable(off) || s.Addr(off) == s.Gateway() {
				t.Fatalf("reserved non-allocatable %d", off)
			}
		}
	})
}
