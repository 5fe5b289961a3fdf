// Package nice sets the CPU scheduling priority (nice value) of the
// whole running process, every thread of it: on Linux setpriority(2)
// with PRIO_PROCESS changes one thread only, and the Go runtime runs
// several. kurma-agent's --nice uses it so that, on a node busy starting
// many sandboxes at once, the agent's plug of a pod's port is not kept
// waiting for a CPU behind them (bench/README.md has the figures). It
// imports only the standard library and golang.org/x/sys/unix.
package nice
