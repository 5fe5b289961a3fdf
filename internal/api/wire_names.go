package api

import (
	"io"

	"kurma.dev/kurma/internal/api/wire"
	"kurma.dev/kurma/internal/pod"
)

// The API's wire types and frame protocol live in package wire, which the
// kurma CLI links without this server (and net/http). These names keep the
// server's code, and the callers that build requests, reading as before.

type (
	ErrorBody        = wire.ErrorBody
	ErrorInfo        = wire.ErrorInfo
	CreatePodRequest = wire.CreatePodRequest
	StopRequest      = wire.StopRequest
	ExecRequest      = wire.ExecRequest
	AttachRequest    = wire.AttachRequest
	PullRequest      = wire.PullRequest
	PullEvent        = wire.PullEvent
	VersionInfo      = wire.VersionInfo
	Control          = wire.Control
	NetworkInfo      = wire.NetworkInfo
	frameWriter      = wire.FrameWriter
)

const (
	Version         = wire.Version
	DefaultSocket   = wire.DefaultSocket
	UpgradeProtocol = wire.UpgradeProtocol
	ErrorTrailer    = wire.ErrorTrailer
	MaxBodyBytes    = wire.MaxBodyBytes

	FrameStdin   = wire.FrameStdin
	FrameStdout  = wire.FrameStdout
	FrameStderr  = wire.FrameStderr
	FrameControl = wire.FrameControl
)

// DecodeCreatePodRequest reads and checks the body of POST /v1/pods
// (wire.DecodeCreatePodRequest).
func DecodeCreatePodRequest(r io.Reader) (*CreatePodRequest, error) {
	return wire.DecodeCreatePodRequest(r)
}

// ValidateSpec checks a pod spec before it reaches the pod manager
// (wire.ValidateSpec).
func ValidateSpec(s *pod.Spec) error { return wire.ValidateSpec(s) }

// ValidPodName reports whether s may name a pod (wire.ValidPodName).
func ValidPodName(s string) bool { return wire.ValidPodName(s) }

func decodeJSON(r io.Reader, v any) error         { return wire.DecodeJSON(r, v) }
func errorBody(err error) ErrorBody               { return wire.ErrorBodyOf(err) }
func readFrame(r io.Reader) (byte, []byte, error) { return wire.ReadFrame(r) }
func decodeControl(p []byte) (Control, error)     { return wire.DecodeControl(p) }
func mustJSON(v any) []byte                       { return wire.MustJSON(v) }
func newFrameWriter(w io.Writer) *frameWriter     { return wire.NewFrameWriter(w) }
