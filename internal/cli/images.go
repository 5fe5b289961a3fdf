package cli

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	image "kurma.dev/kurma/internal/image/imagetypes"
)

func newImageCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Aliases: []string{"images"}, Short: "Manage images"}
	var insecure, quiet bool
	pull := &cobra.Command{
		Use:   "pull [--insecure] URI",
		Short: "Fetch an image (docker://, file://, http(s)://)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := e.client()
			defer c.Close()
			pr := newProgress(e.stderr, isTerminal(e.stderr))
			img, err := c.Pull(cmd.Context(), args[0], insecure, pr.update)
			if err != nil {
				return err
			}
			if e.json {
				return printJSON(e.stdout, img)
			}
			fmt.Fprintln(e.stdout, img.ID)
			return nil
		},
	}
	pull.Flags().BoolVar(&insecure, "insecure", false, "allow plain-HTTP registries")
	ls := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List images",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c := e.client()
			defer c.Close()
			imgs, err := c.ListImages(cmd.Context())
			if err != nil {
				return err
			}
			sort.Slice(imgs, func(i, j int) bool { return imgs[i].Created.After(imgs[j].Created) })
			if e.json {
				if imgs == nil {
					imgs = []*image.Image{}
				}
				return printJSON(e.stdout, imgs)
			}
			if quiet {
				for _, i := range imgs {
					fmt.Fprintln(e.stdout, i.ID)
				}
				return nil
			}
			t := newTable(e.stdout, "IMAGE ID", "NAME", "REFS", "SIZE", "CREATED")
			now := time.Now()
			for _, i := range imgs {
				t.row(short(i.ID), i.Name, strings.Join(i.Refs, ","), size(i.Size), ago(i.Created, now))
			}
			return t.flush()
		},
	}
	ls.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only IDs")
	rm := &cobra.Command{
		Use:   "rm IMAGE...",
		Short: "Remove images and the layers no other image uses",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := e.client()
			defer c.Close()
			return e.eachRef(args, func(ref string) error { return c.RemoveImage(cmd.Context(), ref) })
		},
	}
	inspect := &cobra.Command{
		Use:   "inspect IMAGE...",
		Short: "Show images' records as JSON",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := e.client()
			defer c.Close()
			// Like podman: what was found is printed, the rest fails.
			out := []*image.Image{}
			var errs []error
			for _, ref := range args {
				img, err := c.GetImage(cmd.Context(), ref)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				out = append(out, img)
			}
			if len(out) > 0 {
				if err := printJSON(e.stdout, out); err != nil {
					return err
				}
			}
			return errors.Join(errs...)
		},
	}
	cmd.AddCommand(pull, ls, rm, inspect)
	return cmd
}

// progress draws pull progress: on a terminal one redrawn line per layer
// with a bar; otherwise one plain line per status change.
type progress struct {
	w     io.Writer
	tty   bool
	order []string
	last  map[string]image.Progress
	drawn int
}

func newProgress(w io.Writer, tty bool) *progress {
	return &progress{w: w, tty: tty, last: map[string]image.Progress{}}
}

func (p *progress) update(ev image.Progress) {
	key := ev.Ref
	if key == "" {
		key = "image"
	}
	prev, seen := p.last[key]
	if !seen {
		p.order = append(p.order, key)
	}
	p.last[key] = ev
	if !p.tty {
		if !seen || prev.Status != ev.Status {
			fmt.Fprintf(p.w, "%s: %s%s\n", shortRef(key), ev.Status, amount(ev))
		}
		return
	}
	p.redraw()
}

func (p *progress) redraw() {
	if p.drawn > 0 {
		fmt.Fprintf(p.w, "\x1b[%dA", p.drawn)
	}
	for _, k := range p.order {
		ev := p.last[k]
		fmt.Fprintf(p.w, "\x1b[2K%-20s %-11s %s%s\n", shortRef(k), ev.Status, bar(ev), amount(ev))
	}
	p.drawn = len(p.order)
}

func shortRef(r string) string {
	if strings.HasPrefix(r, "sha256:") || strings.HasPrefix(r, "sha512-") {
		return short(strings.TrimPrefix(r, "sha256:"))
	}
	if len(r) > 40 {
		return "…" + r[len(r)-39:]
	}
	return r
}

func amount(ev image.Progress) string {
	switch {
	case ev.Total > 0:
		return fmt.Sprintf(" %s/%s", size(ev.Current), size(ev.Total))
	case ev.Current > 0:
		return " " + size(ev.Current)
	}
	return ""
}

func bar(ev image.Progress) string {
	const width = 30
	if ev.Total <= 0 {
		return ""
	}
	n := int(ev.Current * width / ev.Total)
	n = max(0, min(n, width))
	return "[" + strings.Repeat("=", n) + strings.Repeat(" ", width-n) + "]"
}
