// Command floorcni is the no-op CNI plugin of bench/k8s's "floor" setup:
// it does no network work at all, so that a run shows how fast pods start
// on this machine when the network costs nothing. ADD prints a valid
// result (in the config's CNI version, 1.0.0 by default) naming CNI_IFNAME
// in CNI_NETNS with an address derived from the container id: the
// container runtime takes the pod IP from the result (containerd 1.6
// fails a sandbox whose result has none), and nothing routes to it. DEL,
// CHECK, GC and STATUS succeed; VERSION lists the versions it prints.
// Standard library only, so that its exec costs what a minimal plugin
// costs.
package main

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"slices"
)

var versions = []string{"0.4.0", "1.0.0", "1.1.0"}

func main() {
	code, out := run(os.Getenv("CNI_COMMAND"), os.Stdin)
	if out != nil {
		_, _ = os.Stdout.Write(append(out, '\n'))
	}
	os.Exit(code)
}

func fail(version string, code int, msg string) (int, []byte) {
	b, _ := json.Marshal(map[string]any{"cniVersion": version, "code": code, "msg": msg})
	return 1, b
}

func run(cmd string, stdin io.Reader) (int, []byte) {
	if cmd == "VERSION" {
		b, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "supportedVersions": versions})
		return 0, b
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.NewDecoder(stdin).Decode(&conf); err != nil {
		return fail("1.0.0", 6, "decode network config: "+err.Error())
	}
	if conf.CNIVersion == "" {
		conf.CNIVersion = "1.0.0"
	}
	if !slices.Contains(versions, conf.CNIVersion) {
		return fail("1.0.0", 1, fmt.Sprintf("incompatible CNI version %q", conf.CNIVersion))
	}
	switch cmd {
	case "DEL", "CHECK", "GC", "STATUS":
		return 0, nil
	case "ADD":
	default:
		return fail(conf.CNIVersion, 4, "CNI_COMMAND "+cmd+" is not supported")
	}
	id, ifname, netns := os.Getenv("CNI_CONTAINERID"), os.Getenv("CNI_IFNAME"), os.Getenv("CNI_NETNS")
	if id == "" || ifname == "" || netns == "" {
		return fail(conf.CNIVersion, 4, "CNI_CONTAINERID, CNI_IFNAME and CNI_NETNS are required")
	}
	// 10.0.0.0/8 minus its first and last /16: 24 bits of the id's hash,
	// so that 100 pods rarely share one.
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	v := h.Sum32()%(1<<24-2<<16) + 1<<16
	addr := fmt.Sprintf("10.%d.%d.%d/8", v>>16&0xff, v>>8&0xff, v&0xff)
	iface := 0
	res := map[string]any{
		"cniVersion": conf.CNIVersion,
		"interfaces": []any{map[string]any{"name": ifname, "sandbox": netns}},
		"ips":        []any{map[string]any{"address": addr, "interface": &iface}},
	}
	if conf.CNIVersion == "0.4.0" {
		res["ips"] = []any{map[string]any{"version": "4", "address": addr, "interface": &iface}}
	}
	b, _ := json.Marshal(res)
	return 0, b
}
