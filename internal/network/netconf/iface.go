package netconf

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/template"
	"text/template/parse"
	"unicode"

	"kurma.dev/kurma/pkg/kerrors"
)

// MaxIfNameLen is the kernel's limit on interface names (IFNAMSIZ - 1).
const MaxIfNameLen = 15

// maxTemplateLen bounds the template text; maxRenderLen bounds what a
// template may write before rendering is cut off (a name is at most 15
// bytes, so anything longer is an error anyway).
const (
	maxTemplateLen = 256
	maxRenderLen   = 64
	maxRandom      = MaxIfNameLen
	renderAttempts = 8
)

// randomAlphabet is what {{random N}} draws from: safe in any interface name.
const randomAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// IfaceData is what a containerInterface template sees as ".".
type IfaceData struct {
	// PodUUID is the pod's UUID as given.
	PodUUID string
	// ShortUUID is the first 8 hex digits of the UUID.
	ShortUUID string
	// Index is the position of the network in the pod's list (0-based).
	Index int
	// Network is the network's name.
	Network string
}

// IfaceTemplate is a compiled containerInterface template. The text is Go
// text/template with these functions besides the built-ins:
//
//	uuid        the pod UUID
//	shortuuid   the first 8 hex digits of the pod UUID
//	netindex    the index of the network in the pod's list
//	random N    N random characters from [a-z0-9] (1 <= N <= 15)
//
// and the fields of IfaceData (.PodUUID, .ShortUUID, .Index, .Network).
// Examples: "eth0", "eth{{.Index}}", "k{{shortuuid}}{{random 3}}".
// An IfaceTemplate is immutable and safe for concurrent use.
type IfaceTemplate struct {
	text string
	tmpl *template.Template
	// random is true when the text calls random, so a colliding render may
	// be retried.
	random bool
}

// funcMap returns the template functions bound to one render. When d is nil
// it returns placeholders, used only to parse.
func funcMap(d *IfaceData, rnd io.Reader) template.FuncMap {
	if d == nil {
		d = &IfaceData{}
	}
	return template.FuncMap{
		"uuid":      func() string { return d.PodUUID },
		"shortuuid": func() string { return d.ShortUUID },
		"netindex":  func() int { return d.Index },
		"random": func(n int) (string, error) {
			if n < 1 || n > maxRandom {
				return "", fmt.Errorf("random %d: want 1 to %d characters", n, maxRandom)
			}
			return randomString(rnd, n)
		},
	}
}

// CompileIface parses a containerInterface template and checks that it
// renders to a valid interface name for a sample pod.
func CompileIface(text string) (*IfaceTemplate, error) {
	if len(text) > maxTemplateLen {
		return nil, kerrors.New(kerrors.Invalid, "interface template is longer than %d bytes", maxTemplateLen)
	}
	t, err := template.New("containerInterface").Option("missingkey=error").Funcs(funcMap(nil, nil)).Parse(text)
	if err != nil {
		return nil, kerrors.New(kerrors.Invalid, "interface template %q: %v", text, err)
	}
	if len(t.Templates()) > 1 {
		return nil, kerrors.New(kerrors.Invalid, "interface template %q: define/block are not allowed", text)
	}
	if err := checkNodes(t.Tree.Root); err != nil {
		return nil, kerrors.New(kerrors.Invalid, "interface template %q: %v", text, err)
	}
	it := &IfaceTemplate{text: text, tmpl: t, random: strings.Contains(text, "random")}
	sample := IfaceData{PodUUID: "00000000-0000-4000-8000-000000000000", ShortUUID: "00000000", Network: "sample"}
	if _, err := it.render(sample, rand.Reader); err != nil {
		return nil, fmt.Errorf("interface template %q: %w", text, err)
	}
	return it, nil
}

// checkNodes rejects loops and template calls: a name template needs
// neither, and a loop could run for a long time without writing anything.
func checkNodes(n parse.Node) error {
	switch n := n.(type) {
	case nil:
		return nil
	case *parse.ListNode:
		if n == nil {
			return nil
		}
		for _, c := range n.Nodes {
			if err := checkNodes(c); err != nil {
				return err
			}
		}
	case *parse.IfNode:
		if err := checkNodes(n.List); err != nil {
			return err
		}
		return checkNodes(n.ElseList)
	case *parse.WithNode:
		if err := checkNodes(n.List); err != nil {
			return err
		}
		return checkNodes(n.ElseList)
	case *parse.RangeNode:
		return fmt.Errorf("range is not allowed")
	case *parse.TemplateNode:
		return fmt.Errorf("template calls are not allowed")
	case *parse.BreakNode, *parse.ContinueNode:
		return fmt.Errorf("break/continue are not allowed")
	}
	return nil
}

// String returns the template text.
func (t *IfaceTemplate) String() string { return t.text }

// RenderOptions are the per-pod inputs of Render.
type RenderOptions struct {
	PodUUID string
	// Index is the network's position in the pod's list of networks.
	Index int
	// Network is the network's name.
	Network string
	// Existing lists the interfaces the pod already has (at least "lo",
	// plus those of earlier networks); the rendered name must differ.
	Existing []string
	// Rand is the source for {{random}}; crypto/rand when nil.
	Rand io.Reader
}

// Render produces the interface name for one pod. The name must be a valid
// Linux interface name and must not be in opts.Existing. Templates that use
// random are re-rendered a few times on a collision; other collisions are
// errors (category Conflict).
func (t *IfaceTemplate) Render(opts RenderOptions) (string, error) {
	rnd := opts.Rand
	if rnd == nil {
		rnd = rand.Reader
	}
	d := IfaceData{PodUUID: opts.PodUUID, ShortUUID: ShortUUID(opts.PodUUID), Index: opts.Index, Network: opts.Network}
	var name string
	for range renderAttempts {
		var err error
		name, err = t.render(d, rnd)
		if err != nil {
			return "", fmt.Errorf("interface template %q: %w", t.text, err)
		}
		if !slices.Contains(opts.Existing, name) {
			return name, nil
		}
		if !t.random {
			break
		}
	}
	return "", kerrors.New(kerrors.Conflict, "interface template %q: name %q is already used in the pod (existing: %s)",
		t.text, name, strings.Join(opts.Existing, ", "))
}

func (t *IfaceTemplate) render(d IfaceData, rnd io.Reader) (string, error) {
	tm, err := t.tmpl.Clone()
	if err != nil {
		return "", err
	}
	tm.Funcs(funcMap(&d, rnd))
	w := &limitWriter{max: maxRenderLen}
	if err := tm.Execute(w, d); err != nil {
		if errors.Is(err, errTooLong) {
			return "", kerrors.New(kerrors.Invalid, "rendered name is longer than %d bytes", MaxIfNameLen)
		}
		return "", kerrors.New(kerrors.Invalid, "render: %v", err)
	}
	name := w.buf.String()
	if err := ValidIfName(name); err != nil {
		return "", err
	}
	return name, nil
}

// ValidIfName reports whether name is usable as a Linux interface name:
// 1 to 15 bytes, not "." or "..", and no '/', ':', whitespace or control
// characters.
func ValidIfName(name string) error {
	switch {
	case name == "":
		return kerrors.New(kerrors.Invalid, "interface name is empty")
	case len(name) > MaxIfNameLen:
		return kerrors.New(kerrors.Invalid, "interface name %q is longer than %d bytes", name, MaxIfNameLen)
	case name == "." || name == "..":
		return kerrors.New(kerrors.Invalid, "interface name %q is not allowed", name)
	}
	for _, r := range name {
		if r == '/' || r == ':' || unicode.IsSpace(r) || unicode.IsControl(r) || r == unicode.ReplacementChar {
			return kerrors.New(kerrors.Invalid, "interface name %q contains %q", name, r)
		}
	}
	return nil
}

// ShortUUID returns the first 8 hex digits of a UUID (dashes removed), or
// the whole string when it is shorter.
func ShortUUID(u string) string {
	s := strings.ReplaceAll(u, "-", "")
	if len(s) > 8 {
		s = s[:8]
	}
	return s
}

func randomString(rnd io.Reader, n int) (string, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(rnd, b); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	for i := range b {
		b[i] = randomAlphabet[int(b[i])%len(randomAlphabet)]
	}
	return string(b), nil
}

var errTooLong = errors.New("output too long")

type limitWriter struct {
	buf bytes.Buffer
	max int
}

func (w *limitWriter) Write(p []byte) (int, error) {
	if w.buf.Len()+len(p) > w.max {
		return 0, errTooLong
	}
	return w.buf.Write(p)
}
