// Command kurma is the command line client of kurmad (see internal/cli).
package main

import (
	"os"

	"kurma.dev/kurma/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
