package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kurma-acbuild:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: kurma-acbuild keygen|build|sign|id|oci-layout ...")
	}
	switch args[0] {
	case "keygen":
		return keygen(args[1:])
	case "build":
		return build(args[1:], stdout)
	case "sign":
		return sign(args[1:])
	case "id":
		return printID(args[1:], stdout)
	case "oci-layout":
		return ociLayout(args[1:], stdout)
	}
	return fmt.Errorf("unknown command %q", args[0])
}

// parseFlags allows flags after positional arguments (sign --key K x.aci,
// sign x.aci --key K).
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}
