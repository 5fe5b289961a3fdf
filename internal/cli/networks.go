package cli

import (
	"strconv"

	"github.com/spf13/cobra"
)

// newNetCmd is `kurma net ls`: the daemon's pod networks and their states.
func newNetCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "net", Aliases: []string{"network", "networks"}, Short: "Show pod networks"}
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List pod networks: name, image, state, default",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c := e.client()
			defer c.Close()
			nets, err := c.ListNetworks(cmd.Context())
			if err != nil {
				return err
			}
			if e.json {
				return printJSON(e.stdout, nets)
			}
			t := newTable(e.stdout, "NAME", "IMAGE", "STATE", "DEFAULT", "RESTARTS", "ERROR")
			for _, n := range nets {
				t.row(n.Name, n.Image, n.State, strconv.FormatBool(n.Default), strconv.Itoa(n.Restarts), n.Error)
			}
			return t.flush()
		},
	}
	cmd.AddCommand(ls)
	return cmd
}
