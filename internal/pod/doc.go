// Package pod is the pod manager of kurmad: it turns a Spec into a running
// pod by a table of steps with rollback (resolve images, make directories,
// write the stager manifest, launch the stager in its namespaces, wait for
// readiness), keeps each pod's record on disk so a restarted daemon re-adopts
// its pods, and drives the stager call-ins.
//
// It must not import the API server or the CLI.
package pod
