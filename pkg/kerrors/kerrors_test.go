package kerrors_test

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"kurma.dev/kurma/pkg/kerrors"
)

func TestCategories(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		status int
		typ    string
	}{
		{"not found wrapped", fmt.Errorf("get pod: %w", kerrors.New(kerrors.NotFound, "pod %q", "x")), http.StatusNotFound, "NotFound"},
		{"conflict", kerrors.New(kerrors.Conflict, "dup"), http.StatusConflict, "Conflict"},
		{"exhausted is a conflict", kerrors.New(kerrors.Exhausted, "no ips"), http.StatusConflict, "Exhausted"},
		{"invalid", kerrors.New(kerrors.Invalid, "bad"), http.StatusBadRequest, "Invalid"},
		{"unauthorized", kerrors.Unauthorized, http.StatusUnauthorized, "Unauthorized"},
		{"unavailable", kerrors.Unavailable, http.StatusServiceUnavailable, "Unavailable"},
		{"timeout", kerrors.Timeout, http.StatusGatewayTimeout, "Timeout"},
		{"plain", errors.New("boom"), http.StatusInternalServerError, "Internal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := kerrors.HTTPStatus(tt.err); got != tt.status {
				t.Errorf("HTTPStatus = %d, want %d", got, tt.status)
			}
			if got := kerrors.Type(tt.err); got != tt.typ {
				t.Errorf("Type = %q, want %q", got, tt.typ)
			}
			back := kerrors.FromType(kerrors.Type(tt.err), tt.err.Error())
			if kerrors.Type(back) != tt.typ || back.Error() != tt.err.Error() {
				t.Errorf("FromType round trip = %v (%s)", back, kerrors.Type(back))
			}
		})
	}
}
