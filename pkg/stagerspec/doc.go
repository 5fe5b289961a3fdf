// Package stagerspec is the contract between kurmad and any stager, written
// from the Kurma stager specification: the stager manifest at /manifest, the
// paths kurmad prepares in the stager's root, the readiness descriptor, and
// the JSON that the call-ins (/opt/stager/status, logs, run, attach) speak.
//
// It is in pkg/ because third-party stagers are meant to import it. It must
// import nothing from Kurma but pkg/appc.
package stagerspec
