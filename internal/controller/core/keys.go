package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"kurma.dev/kurma/internal/controller/store"
	"kurma.dev/kurma/pkg/kerrors"
)

// Store keys. Ids are validated (validID) before they become key segments.
func projectKey(pid string) string      { return "projects/" + pid }
func vpcKey(pid, id string) string      { return "vpcs/" + pid + "/" + id }
func vniKey(vni uint32) string          { return fmt.Sprintf("vni/%08d", vni) }
func subnetKey(pid, id string) string   { return "subnets/" + pid + "/" + id }
func ipamPrefix(pid, sid string) string { return "ipam/" + pid + "/" + sid + "/" }
func blockKey(pid, sid string, blk int) string {
	return fmt.Sprintf("%s%06d", ipamPrefix(pid, sid), blk)
}
func portKey(pid, id string) string        { return "ports/" + pid + "/" + id }
func macKey(mac string) string             { return "macs/" + mac }
func hostIdxKey(h, pid, id string) string  { return "idx/host/" + h + "/" + pid + "/" + id }
func devIdxKey(pid, dev, id string) string { return "idx/dev/" + pid + "/" + dev + "/" + id }
func nameIdxKey(pid, n, id string) string  { return "idx/name/" + pid + "/" + n + "/" + id }

// vpcIdxKey indexes a port under its VPC, for watches that follow the
// VPCs a host has ports in.
func vpcIdxKey(pid, vpc, id string) string { return "idx/vpc/" + pid + "/" + vpc + "/" + id }
func hostKey(id string) string             { return "hosts/" + id }

// getJSON reads key into v; NotFound names kind and id.
func (s *Core) getJSON(ctx context.Context, key, kind, id string, v any) (int64, error) {
	kv, err := s.st.Get(ctx, key)
	if err != nil {
		if errors.Is(err, kerrors.NotFound) {
			return 0, kerrors.New(kerrors.NotFound, "%s %q not found", kind, id)
		}
		return 0, fmt.Errorf("get %s %s: %w", kind, id, err)
	}
	if err := json.Unmarshal(kv.Value, v); err != nil {
		return 0, fmt.Errorf("decode stored %s %s: %w", kind, id, err)
	}
	return kv.ModRev, nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("marshal %T: %v", v, err)) // only plain structs are marshalled
	}
	return b
}

func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// txnFailedOn reports whether err is a transaction failure on key.
func txnFailedOn(err error, key string) bool {
	var te *store.TxnError
	if !errors.As(err, &te) {
		return false
	}
	return (te.Cond != nil && te.Cond.Key == key) || (te.Op != nil && te.Op.Key == key)
}

// requireProject checks that project pid exists (positive answers cached;
// writes under a project still carry a store condition on it).
func (s *Core) requireProject(ctx context.Context, pid string) error {
	if err := ValidID("project", pid); err != nil {
		return err
	}
	s.mu.Lock()
	ok := s.projects[pid]
	s.mu.Unlock()
	if ok {
		return nil
	}
	if _, err := s.st.Get(ctx, projectKey(pid)); err != nil {
		if errors.Is(err, kerrors.NotFound) {
			return kerrors.New(kerrors.NotFound, "project %q not found", pid)
		}
		return fmt.Errorf("get project %s: %w", pid, err)
	}
	s.mu.Lock()
	s.projects[pid] = true
	s.mu.Unlock()
	return nil
}

// Load balancers and floating IPs share the prefix svcPrefix, so that one
// store watch feeds WatchLoadBalancers with both, in revision order.
const svcPrefix = "svc/"

func lbKey(pid, id string) string  { return "svc/lb/" + pid + "/" + id }
func fipKey(pid, id string) string { return "svc/fip/" + pid + "/" + id }

// extnetKey stores an external network; its address bitmap lives under
// extIpamPrefix, apart from the subnets' "ipam/<pid>/<sid>/".
func extnetKey(id string) string     { return "extnets/" + id }
func extIpamPrefix(id string) string { return "ipamx/" + id + "/" }

// fipRefKey holds the id of the floating IP associated with a port (kind
// "port") or a load balancer (kind "lb"); there is at most one. An
// association and the deletion of its target both carry a condition on
// this key, so neither can miss the other: no association outlives its
// target.
func fipRefKey(kind, pid, id string) string { return "fipref/" + kind + "/" + pid + "/" + id }

// RequireProject checks that project pid exists, from the cache when it
// can (the HTTP layer asks before it reads a body).
func (s *Core) RequireProject(ctx context.Context, pid string) error {
	return s.requireProject(ctx, pid)
}
