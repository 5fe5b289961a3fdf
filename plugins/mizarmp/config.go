package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// Default limits. The 1-minute wait for UP is spec 003's.
const (
	defaultUpTimeout      = time.Minute
	defaultRequestTimeout = 10 * time.Second
	// defaultRetryBudget is how long transient controller errors are
	// retried: 5 s below kurmad's 60 s limit on one plugin call (the
	// shortest runtime timeout the plugin runs under; CRI runtimes allow
	// 2 min), so that the last error, not a kill, ends a failed ADD.
	defaultRetryBudget = 55 * time.Second
	maxIDLen           = 128
)

// NetConf is the plugin's network configuration (spec 003 plus the standard
// CNI fields types.PluginConf carries: cniVersion, name, type, capabilities,
// dns, prevResult, cni.dev/valid-attachments).
type NetConf struct {
	types.PluginConf

	// MPURL is the controller's base URL (spec 003 "mpurl").
	MPURL string `json:"mpurl"`
	// Subnet is the id sent as the port's network_id.
	Subnet string `json:"subnet"`
	// Project is the project id in every request path.
	Project string `json:"project"`
	// HostID is the port's binding:host_id: the id this host's agent
	// registered with the controller.
	HostID string `json:"hostId"`

	// Token, when set, is sent as "Authorization: Bearer <token>".
	Token string `json:"token,omitempty"`
	// Timeouts overrides the default limits.
	Timeouts *Timeouts `json:"timeouts,omitempty"`

	// Args and RuntimeConfig are standard CNI fields; the plugin reads none
	// of their keys and ignores what it does not understand.
	Args          map[string]json.RawMessage `json:"args,omitempty"`
	RuntimeConfig map[string]json.RawMessage `json:"runtimeConfig,omitempty"`

	base      *url.URL
	upTimeout time.Duration
	reqTime   time.Duration
	retry     time.Duration
}

// Timeouts are Go duration strings ("60s", "500ms").
type Timeouts struct {
	// Up bounds the wait for the port to become UP (default 1m).
	Up string `json:"up,omitempty"`
	// Request bounds each single HTTP request (default 10s).
	Request string `json:"request,omitempty"`
	// Retry bounds, from the start of the verb, how long requests that
	// failed transiently (controller unreachable, connection lost, HTTP
	// 500/502/503) are retried with backoff (default 55s; "0s" never
	// retries). STATUS never retries: it reports the controller as it is.
	Retry string `json:"retry,omitempty"`
}

// fieldError is a configuration error that names the offending field. It
// becomes CNI error code 7 (invalid network config).
type fieldError struct {
	field string
	msg   string
}

func (e *fieldError) Error() string { return fmt.Sprintf("config field %q: %s", e.field, e.msg) }

// parseConfig decodes and validates stdin config. Errors are *types.Error
// with code 6 (undecodable JSON) or 7 (a field missing or malformed, named
// in the message).
func parseConfig(data []byte) (*NetConf, error) {
	var c NetConf
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decode network config", err.Error())
	}
	if err := c.validate(); err != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	if c.RawPrevResult != nil {
		if err := version.ParsePrevResult(&c.PluginConf); err != nil {
			return nil, types.NewError(types.ErrInvalidNetworkConfig,
				(&fieldError{"prevResult", err.Error()}).Error(), "")
		}
	}
	return &c, nil
}

func (c *NetConf) validate() error {
	if c.CNIVersion == "" {
		return &fieldError{"cniVersion", "missing"}
	}
	if c.Name == "" {
		return &fieldError{"name", "missing"}
	}
	if c.Type == "" {
		return &fieldError{"type", "missing"}
	}
	if c.MPURL == "" {
		return &fieldError{"mpurl", "missing"}
	}
	u, err := url.Parse(c.MPURL)
	if err != nil {
		return &fieldError{"mpurl", err.Error()}
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		u.RawQuery != "" || u.Fragment != "" {
		return &fieldError{"mpurl", "must be an http(s) URL with a host and no user, query or fragment"}
	}
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
	}
	u.RawPath = ""
	c.base = u
	for _, f := range []struct{ name, val string }{
		{"subnet", c.Subnet}, {"project", c.Project}, {"hostId", c.HostID},
	} {
		if err := checkID(f.val); err != nil {
			return &fieldError{f.name, err.Error()}
		}
	}
	if strings.ContainsAny(c.Token, "\r\n") {
		return &fieldError{"token", "must not contain line breaks"}
	}
	c.upTimeout, c.reqTime, c.retry = defaultUpTimeout, defaultRequestTimeout, defaultRetryBudget
	if c.Timeouts != nil {
		if c.Timeouts.Retry == "0" || c.Timeouts.Retry == "0s" {
			c.retry = 0
		} else if c.retry, err = parseDuration(c.Timeouts.Retry, defaultRetryBudget); err != nil {
			return &fieldError{"timeouts.retry", err.Error()}
		}
		if c.upTimeout, err = parseDuration(c.Timeouts.Up, defaultUpTimeout); err != nil {
			return &fieldError{"timeouts.up", err.Error()}
		}
		if c.reqTime, err = parseDuration(c.Timeouts.Request, defaultRequestTimeout); err != nil {
			return &fieldError{"timeouts.request", err.Error()}
		}
	}
	return nil
}

func parseDuration(s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, err
	}
	if d <= 0 || d > 10*time.Minute {
		return 0, errors.New("must be > 0 and at most 10m")
	}
	return d, nil
}

// checkID accepts ids that are safe as one URL path segment and as a query
// value: letters, digits and . _ : - only, 1 to 128 bytes, not "." or "..".
func checkID(s string) error {
	if s == "" {
		return errors.New("missing")
	}
	if len(s) > maxIDLen {
		return fmt.Errorf("longer than %d bytes", maxIDLen)
	}
	if s == "." || s == ".." {
		return errors.New("must not be . or ..")
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z', ch >= '0' && ch <= '9',
			ch == '.', ch == '_', ch == ':', ch == '-':
		default:
			return fmt.Errorf("invalid character %q (allowed: letters, digits, . _ : -)", ch)
		}
	}
	return nil
}

// cniArgs holds the CNI_ARGS keys the plugin understands.
type cniArgs struct {
	PodNamespace string // K8S_POD_NAMESPACE
	PodName      string // K8S_POD_NAME
	SandboxID    string // K8S_POD_INFRA_CONTAINER_ID
}

// parseCNIArgs reads CNI_ARGS: "K=V" pairs separated by ";". Unknown keys
// are ignored (whatever IgnoreUnknown says); a pair without "=" or with an
// empty key, or a value with control characters, is an error (CNI code 4).
func parseCNIArgs(s string) (cniArgs, error) {
	var a cniArgs
	if s == "" {
		return a, nil
	}
	if len(s) > 64<<10 {
		return a, errors.New("CNI_ARGS: longer than 64 KiB")
	}
	for _, pair := range strings.Split(s, ";") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return cniArgs{}, fmt.Errorf("CNI_ARGS: invalid pair %q (want KEY=VALUE)", pair)
		}
		for _, r := range k + v {
			if r < 0x20 || r == 0x7f {
				return cniArgs{}, fmt.Errorf("CNI_ARGS: control character in %q", pair)
			}
		}
		switch k {
		case "K8S_POD_NAMESPACE":
			a.PodNamespace = v
		case "K8S_POD_NAME":
			a.PodName = v
		case "K8S_POD_INFRA_CONTAINER_ID":
			a.SandboxID = v
		}
	}
	return a, nil
}
