// Package mpenv starts a real Kurma network control plane for mizarmp
// tests and benchmarks: the kurma-controller binary on a loopback port with
// a bbolt store in a temp dir, optionally the kurma-agent binary for this
// host, and a project, VPC and subnet to attach to. Close stops both
// processes (by PID) and removes every link and the nft table the agent
// made under the caller's prefix.
//
// It does not import testing, so the benchmark (package main) can use it;
// tests wrap it with a t.Cleanup. It drives the shipped binaries.
// Must not import: `kurma.dev/kurma/internal/controller/...`,
// `kurma.dev/kurma/internal/agent/...`, `testing`.
//
// Locking: an Env is used from one goroutine (its Client is concurrency
// safe).
package mpenv
