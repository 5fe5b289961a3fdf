package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"kurma.dev/kurma/pkg/kerrors"
)

// supportedVersions is every CNI version the plugin speaks, 0.1.0 to 1.1.0.
var supportedVersions = version.PluginSupports("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

func main() {
	tr := newTracer()
	// skel reads stdin itself; read it first so that error JSON can carry
	// the config's cniVersion (CNI 1.x), then hand skel a copy.
	stdin, err := io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	if err != nil {
		exitWith("", types.NewError(types.ErrIOFailure, "read stdin", err.Error()))
	}
	if err := replaceStdin(stdin); err != nil {
		exitWith("", types.NewError(types.ErrIOFailure, "read stdin", err.Error()))
	}
	e := skel.PluginMainFuncsWithError(skel.CNIFuncs{
		Add:    func(a *skel.CmdArgs) error { return run(a, tr, cmdAdd) },
		Del:    func(a *skel.CmdArgs) error { return run(a, tr, cmdDel) },
		Check:  func(a *skel.CmdArgs) error { return run(a, tr, cmdCheck) },
		GC:     func(a *skel.CmdArgs) error { return run(a, tr, cmdGC) },
		Status: func(a *skel.CmdArgs) error { return run(a, tr, cmdStatus) },
	}, supportedVersions, "mizarmp: CNI plugin backed by the Kurma network controller")
	tr.report(os.Getenv("CNI_COMMAND"))
	if e != nil {
		exitWith(errorVersion(stdin), e)
	}
}

// replaceStdin makes os.Stdin a pipe holding data.
func replaceStdin(data []byte) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	go func() {
		_, _ = w.Write(data)
		_ = w.Close()
	}()
	os.Stdin = r
	return nil
}

// errorVersion is the cniVersion to put in error JSON: the config's when it
// is one we speak, else the newest.
func errorVersion(stdin []byte) string {
	var c struct {
		CNIVersion string `json:"cniVersion"`
	}
	if json.Unmarshal(stdin, &c) == nil && slices.Contains(supportedVersions.SupportedVersions(), c.CNIVersion) {
		return c.CNIVersion
	}
	return version.Current()
}

// exitWith prints e as CNI error JSON on stdout and exits 1.
func exitWith(cniVersion string, e *types.Error) {
	if cniVersion == "" {
		cniVersion = version.Current()
	}
	out, _ := json.Marshal(struct {
		CNIVersion string `json:"cniVersion"`
		*types.Error
	}{cniVersion, e})
	_, _ = os.Stdout.Write(append(out, '\n'))
	os.Exit(1)
}

// invocation is everything one verb needs: the parsed config, CNI_ARGS and
// a controller client whose connections are reused across the verb's
// requests.
type invocation struct {
	args *skel.CmdArgs
	conf *NetConf
	cni  cniArgs
	api  *apiClient
	// retryUntil ends the retries of transient controller errors
	// (timeouts.retry after the verb started).
	retryUntil time.Time
}

// run parses the config and CNI_ARGS, builds the client, runs verb under the
// config's overall limit and maps its error to a CNI error.
func run(a *skel.CmdArgs, tr *tracer, verb func(context.Context, *invocation) error) error {
	conf, err := parseConfig(a.StdinData)
	if err != nil {
		return err
	}
	ca, err := parseCNIArgs(a.Args)
	if err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	if a.ContainerID != "" {
		if err := checkID(a.ContainerID); err != nil {
			return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_CONTAINERID: "+err.Error(), "")
		}
	}
	api, err := newClient(conf, tr)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, (&fieldError{"mpurl", err.Error()}).Error(), "")
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), max(conf.upTimeout, conf.retry)+2*conf.reqTime)
	defer cancel()
	inv := &invocation{args: a, conf: conf, cni: ca, api: api, retryUntil: start.Add(conf.retry)}
	if os.Getenv("CNI_COMMAND") == "STATUS" {
		inv.retryUntil = start
	}
	return cniError(verb(ctx, inv))
}

// newClient returns the plugin's controller client (api.go): no proxy
// lookup, no TCP keep-alive probes, one connection reused across the
// verb's sequential requests.
func newClient(c *NetConf, tr *tracer) (*apiClient, error) {
	return newAPIClient(c.base, c.Token, c.reqTime, tr), nil
}

// cniError maps an error category to a CNI error code: an unreachable or
// unavailable controller is 11 (try again later), a rejected request 7
// (invalid network config), a timeout 11; everything else 999.
func cniError(err error) error {
	if err == nil {
		return nil
	}
	var te *types.Error
	if errors.As(err, &te) {
		return te
	}
	code := uint(types.ErrInternal)
	switch {
	case errors.Is(err, kerrors.Unavailable), errors.Is(err, kerrors.Timeout),
		errors.Is(err, kerrors.Exhausted), errors.Is(err, context.DeadlineExceeded):
		code = types.ErrTryAgainLater
	case errors.Is(err, kerrors.Invalid), errors.Is(err, kerrors.NotFound),
		errors.Is(err, kerrors.Unauthorized):
		code = types.ErrInvalidNetworkConfig
	}
	return types.NewError(code, err.Error(), "")
}
