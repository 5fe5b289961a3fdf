package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// uninstallOpts says what an agent of this host was run with.
type uninstallOpts struct {
	owner         string   // alias owner tag of the agent's links
	nftTables     []string // inet (and bridge) tables of the datapath and the load balancers
	routeProtocol int      // protocol tag of the load balancers' routes
	stateDir      string
	binDir        string // where the shim was installed ("": not installed)
	confDir       string // where the conflist was written ("": not written)
	extraDirs     []string
}

// uninstallHost removes what kurma-agent left on the host it runs on: the
// links whose alias carries the owner tag (pod veths, VPC bridges and
// VXLAN devices), the routes tagged with the load balancers' protocol, the
// nftables tables, the CNI shim and conflist it installed and its state
// folder. Run it once no agent runs: each step is idempotent, and every
// error is reported after all steps ran. The forwarding sysctls the agent
// turned on are left on (other software of the node may need them).
func uninstallHost(ctx context.Context, o uninstallOpts, log *slog.Logger) error {
	var errs []error
	if o.stateDir != "" {
		// Refuse while an agent holds the lock: it would rebuild it all.
		if _, err := os.Stat(o.stateDir); err == nil {
			unlock, err := lockStateDir(o.stateDir)
			if err != nil {
				return fmt.Errorf("uninstall: %w", err)
			}
			defer unlock()
		}
	}
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("uninstall: list links: %w", err)
	}
	// Ports first (their veth peers go with them), then bridges and VXLAN.
	slices.SortStableFunc(links, func(a, b netlink.Link) int {
		return strings.Compare(linkKind(a.Attrs().Alias), linkKind(b.Attrs().Alias))
	})
	for _, l := range links {
		if !strings.HasPrefix(l.Attrs().Alias, o.owner+":") {
			continue
		}
		if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("delete link %s: %w", l.Attrs().Name, err))
			continue
		}
		log.Info("removed link", "name", l.Attrs().Name, "alias", l.Attrs().Alias)
	}
	if o.routeProtocol != 0 {
		filter := &netlink.Route{Table: unix.RT_TABLE_UNSPEC, Protocol: netlink.RouteProtocol(o.routeProtocol)}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			errs = append(errs, fmt.Errorf("list routes: %w", err))
		}
		for _, r := range routes {
			if err := netlink.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("delete route %v: %w", r.Dst, err))
				continue
			}
			log.Info("removed route", "dst", r.Dst, "table", r.Table)
		}
	}
	seen := map[string]bool{}
	for _, t := range o.nftTables {
		if t == "" || seen[t] {
			continue
		}
		seen[t] = true
		for _, fam := range []knftables.Family{knftables.InetFamily, knftables.BridgeFamily} {
			if err := deleteTable(ctx, fam, t); err != nil {
				errs = append(errs, err)
				continue
			}
			log.Info("removed nft table", "family", fam, "name", t)
		}
	}
	for _, f := range []string{dirFile(o.confDir, confName), dirFile(o.binDir, shimName)} {
		if f == "" {
			continue
		}
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		log.Info("removed file", "path", f)
	}
	for _, d := range append([]string{o.stateDir}, o.extraDirs...) {
		if d == "" {
			continue
		}
		if err := removeContents(d); err != nil {
			errs = append(errs, err)
		} else {
			log.Info("emptied folder", "path", d)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	log.Info("uninstalled")
	return nil
}

// linkKind orders aliases: ports before VPC links.
func linkKind(alias string) string {
	if strings.Contains(alias, ":port:") {
		return "0"
	}
	return "1"
}

func dirFile(dir, name string) string {
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, name)
}

// deleteTable deletes an nftables table; a missing one is not an error.
func deleteTable(ctx context.Context, fam knftables.Family, name string) error {
	nft, err := knftables.New(fam, name)
	if err != nil {
		return fmt.Errorf("nft %s %s: %w", fam, name, err)
	}
	tx := nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
		return fmt.Errorf("delete nft table %s %s: %w", fam, name, err)
	}
	return nil
}

// removeContents empties dir (the folder itself is a host mount point in
// the DaemonSet) and removes it when it can.
func removeContents(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	_ = os.Remove(dir) // busy when it is a mount point: left empty
	return errors.Join(errs...)
}
