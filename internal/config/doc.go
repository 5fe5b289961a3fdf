// Package config owns kurmad's configuration file: its schema, the defaults
// that let kurmad run without one, and its validation.
//
// The file is YAML or JSON (sigs.k8s.io/yaml reads both); unknown keys are
// an error so a typo never silently falls back to a default. pod_networks
// (also spelled podNetworks) is kept as raw JSON entries: the networking
// package parses them.
//
// Config values are plain data; the package holds no global state and no
// locks. It must not import the pod manager, the image store, the API or the
// networking packages.
package config
