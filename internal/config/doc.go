// Package config owns kurmad's configuration file: its schema, the defaults
// that let kurmad run without one, and its validation.
//
// The file is YAML or JSON (sigs.k8s.io/yaml reads both); unknown keys are
// an error so a typo never silently falls back to a default. pod_networks
// (also spelled podNetworks) is kept as raw JSON entries: the networking
// package parses them.
//
// Config values are plain data; the package holds no global state and no
// locks.
// Must not import: `kurma.dev/kurma/internal/image`,
// `kurma.dev/kurma/internal/api/...`,
// `kurma.dev/kurma/internal/network/manager`,
// `kurma.dev/kurma/internal/network/netplugin`,
// `kurma.dev/kurma/internal/stager`.
package config
