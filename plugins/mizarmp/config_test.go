package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

const goodConf = `{"cniVersion":"1.1.0","name":"net1","type":"mizarmp","mpurl":"http://127.0.0.1:9696","subnet":"a87e0f87-a2d9-44ef-9194-9a62f178594e","project":"3dda2801-d675-4688-a63f-dcda8d327f50","hostId":"localhost"}`

func withField(k, v string) string {
	return strings.Replace(goodConf, `"hostId"`, `"`+k+`":`+v+`,"hostId"`, 1)
}

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		code  uint   // 0: success
		field string // named in the error message
	}{
		{"good", goodConf, 0, ""},
		{"spec 003 sample", `{"cniVersion":"0.3.1","name":"mizarmp-default","type":"mizarmp","mpurl":"http://127.0.0.1","subnet":"a87e0f87-a2d9-44ef-9194-9a62f178594e","project":"3dda2801-d675-4688-a63f-dcda8d327f50","hostId":"localhost"}`, 0, ""},
		{"optional fields", withField("token", `"s3cret"`), 0, ""},
		{"timeouts", withField("timeouts", `{"up":"5s","request":"250ms"}`), 0, ""},
		{"unknown args ignored", withField("args", `{"cni":{"whatever":[1,2]},"x":1}`), 0, ""},
		{"runtimeConfig ignored", withField("runtimeConfig", `{"portMappings":[]}`), 0, ""},
		{"dns", withField("dns", `{"nameservers":["10.0.0.2"],"search":["a.b"]}`), 0, ""},
		{"not json", `{"cniVersion":`, types.ErrDecodingFailure, ""},
		{"missing mpurl", strings.Replace(goodConf, `"mpurl":"http://127.0.0.1:9696",`, "", 1), types.ErrInvalidNetworkConfig, "mpurl"},
		{"bad mpurl scheme", strings.Replace(goodConf, "http://127.0.0.1:9696", "ftp://x", 1), types.ErrInvalidNetworkConfig, "mpurl"},
		{"mpurl with query", strings.Replace(goodConf, "http://127.0.0.1:9696", "http://x/?a=b", 1), types.ErrInvalidNetworkConfig, "mpurl"},
		{"mpurl not string", strings.Replace(goodConf, `"http://127.0.0.1:9696"`, `7`, 1), types.ErrDecodingFailure, ""},
		{"missing subnet", strings.Replace(goodConf, `"subnet":"a87e0f87-a2d9-44ef-9194-9a62f178594e",`, "", 1), types.ErrInvalidNetworkConfig, "subnet"},
		{"subnet with slash", strings.Replace(goodConf, "a87e0f87-a2d9", "../../x", 1), types.ErrInvalidNetworkConfig, "subnet"},
		{"missing project", strings.Replace(goodConf, `"project":"3dda2801-d675-4688-a63f-dcda8d327f50",`, "", 1), types.ErrInvalidNetworkConfig, "project"},
		{"project with query", strings.Replace(goodConf, "3dda2801-d675", "a?b=c", 1), types.ErrInvalidNetworkConfig, "project"},
		{"missing hostId", strings.Replace(goodConf, `,"hostId":"localhost"`, "", 1), types.ErrInvalidNetworkConfig, "hostId"},
		{"long hostId", strings.Replace(goodConf, `"localhost"`, `"`+strings.Repeat("h", 200)+`"`, 1), types.ErrInvalidNetworkConfig, "hostId"},
		{"missing name", strings.Replace(goodConf, `"name":"net1",`, "", 1), types.ErrInvalidNetworkConfig, "name"},
		{"missing cniVersion", strings.Replace(goodConf, `"cniVersion":"1.1.0",`, "", 1), types.ErrInvalidNetworkConfig, "cniVersion"},
		{"bad timeout", withField("timeouts", `{"up":"soon"}`), types.ErrInvalidNetworkConfig, "timeouts.up"},
		{"negative timeout", withField("timeouts", `{"request":"-1s"}`), types.ErrInvalidNetworkConfig, "timeouts.request"},
		{"bad retry", withField("timeouts", `{"retry":"11m"}`), types.ErrInvalidNetworkConfig, "timeouts.retry"},
		{"token with newline", withField("token", `"a\nb"`), types.ErrInvalidNetworkConfig, "token"},
		{"bad prevResult", withField("prevResult", `{"cniVersion":"1.0.0","ips":[{"address":"nonsense"}]}`), types.ErrInvalidNetworkConfig, "prevResult"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseConfig([]byte(tt.in))
			if tt.code == 0 {
				if err != nil {
					t.Fatalf("parseConfig: %v", err)
				}
				if c.base == nil || c.upTimeout <= 0 || c.reqTime <= 0 {
					t.Fatalf("defaults not set: %+v", c)
				}
				return
			}
			var te *types.Error
			if !errors.As(err, &te) {
				t.Fatalf("err = %v, want *types.Error code %d", err, tt.code)
			}
			if te.Code != tt.code {
				t.Fatalf("code = %d (%s), want %d", te.Code, te.Msg, tt.code)
			}
			if tt.field != "" && !strings.Contains(te.Msg, `"`+tt.field+`"`) {
				t.Fatalf("message %q does not name field %q", te.Msg, tt.field)
			}
		})
	}
}

func TestTimeoutsApplied(t *testing.T) {
	c, err := parseConfig([]byte(withField("timeouts", `{"up":"5s","request":"250ms"}`)))
	if err != nil {
		t.Fatal(err)
	}
	if c.upTimeout != 5*time.Second || c.reqTime != 250*time.Millisecond {
		t.Fatalf("timeouts = %v %v", c.upTimeout, c.reqTime)
	}
	if got := c.base.String(); got != "http://127.0.0.1:9696/" {
		t.Fatalf("base = %q", got)
	}
	for _, tt := range []struct {
		conf string
		want time.Duration
	}{
		{goodConf, defaultRetryBudget},
		{withField("timeouts", `{"retry":"2s"}`), 2 * time.Second},
		{withField("timeouts", `{"retry":"0s"}`), 0},
	} {
		c, err := parseConfig([]byte(tt.conf))
		if err != nil {
			t.Errorf("%s: %v", tt.conf, err)
		} else if c.retry != tt.want {
			t.Errorf("retry budget of %s = %v, want %v", tt.conf, c.retry, tt.want)
		}
	}
}

func TestParseCNIArgs(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    cniArgs
		wantErr bool
	}{
		{"empty", "", cniArgs{}, false},
		{"k8s", "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=abc", cniArgs{"ns", "p", "abc"}, false},
		{"unknown ignored", "FOO=bar;K8S_POD_NAME=p", cniArgs{PodName: "p"}, false},
		{"trailing semicolon", "K8S_POD_NAME=p;", cniArgs{PodName: "p"}, false},
		{"value with equals", "K8S_POD_NAME=a=b", cniArgs{PodName: "a=b"}, false},
		{"no equals", "K8S_POD_NAME", cniArgs{}, true},
		{"empty key", "=x", cniArgs{}, true},
		{"control char", "K8S_POD_NAME=a\nb", cniArgs{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseCNIArgs(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{goodConf, withField("timeouts", `{"up":"5s"}`), withField("timeouts", `{"retry":"0s"}`), `{}`, `[]`, `{"prevResult":{"cniVersion":"1.0.0"}}`,
		withField("prevResult", `{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24"}]}`)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseConfig(data)
		if err != nil {
			var te *types.Error
			if !errors.As(err, &te) || (te.Code != types.ErrDecodingFailure && te.Code != types.ErrInvalidNetworkConfig) {
				t.Fatalf("error %v is not a code 6/7 CNI error", err)
			}
			return
		}
		for _, id := range []string{c.Subnet, c.Project, c.HostID} {
			if checkID(id) != nil || strings.ContainsAny(id, "/?#%") {
				t.Fatalf("accepted unsafe id %q", id)
			}
		}
		if c.base == nil || (c.base.Scheme != "http" && c.base.Scheme != "https") {
			t.Fatalf("accepted bad base %v", c.base)
		}
	})
}

func FuzzParseCNIArgs(f *testing.F) {
	for _, s := range []string{"", "K8S_POD_NAME=p;K8S_POD_NAMESPACE=n", "IgnoreUnknown=1;X=y", "=", ";;", "a=b=c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := parseCNIArgs(s)
		if err != nil {
			if a != (cniArgs{}) {
				t.Fatalf("partial result %+v with error", a)
			}
			return
		}
		for _, v := range []string{a.PodName, a.PodNamespace, a.SandboxID} {
			if strings.ContainsAny(v, ";\n\x00") {
				t.Fatalf("value %q holds a separator or control char", v)
			}
		}
	})
}
