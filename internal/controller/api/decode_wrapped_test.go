package api

import (
	"errors"
	"strings"
	"testing"

	capi "kurma.dev/kurma/pkg/controllerapi"
	"kurma.dev/kurma/pkg/kerrors"
)

func TestDecodeWrapped(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		wantErr string // substring of the error; "" for success
		want    string // VPC name on success
	}{
		{"object", `{"vpc":{"name":"a"}}`, "", "a"},
		{"empty object is an object", `{"vpc":{}}`, "", ""},
		{"missing object", `{}`, `body must be {"vpc":{...}}`, ""},
		{"null object", `{"vpc":null}`, `body must be {"vpc":{...}}`, ""},
		{"wrong envelope key", `{"subnet":{}}`, `unknown field "subnet"`, ""},
		{"unknown inner field", `{"vpc":{"bogus":1}}`, `unknown field "bogus"`, ""},
		{"wrong type names the path", `{"vpc":{"name":1}}`, `"vpc.name"`, ""},
		{"trailing data", `{"vpc":{}} {}`, "trailing data", ""},
		{"empty body", ``, "empty body", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := decodeWrapped[capi.VPC]([]byte(tt.body), "vpc")
			if tt.wantErr == "" {
				if err != nil || v.Name != tt.want {
					t.Fatalf("got %+v, %v; want name %q", v, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, kerrors.Invalid) {
				t.Fatalf("error = %v, want Invalid containing %q", err, tt.wantErr)
			}
		})
	}
}
