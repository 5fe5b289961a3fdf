package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"kurma.dev/kurma/internal/image/ocibuild"
)

// withLibraries returns the program at path (placed at dst) and every
// shared library `ldd` lists for it, each at the path the dynamic loader
// looks it up by, with the content of the file that path resolves to.
func withLibraries(path, dst string) ([]ocibuild.File, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, fmt.Errorf("--nft: %w", err)
	}
	out, err := exec.Command("ldd", real).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", real, err)
	}
	libs, err := parseLdd(out)
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", real, err)
	}
	files := []ocibuild.File{{Path: dst, Mode: 0o755, Source: real}}
	for _, l := range libs {
		src, err := filepath.EvalSymlinks(l)
		if err != nil {
			return nil, fmt.Errorf("library %s: %w", l, err)
		}
		files = append(files, ocibuild.File{Path: l, Mode: 0o755, Source: src})
	}
	return files, nil
}

// parseLdd returns the absolute library paths of ldd's output: "name =>
// /path (addr)" and the loader's "/path (addr)"; the vDSO has none.
func parseLdd(out []byte) ([]string, error) {
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 3 && f[1] == "=>":
			if f[2] == "not" {
				return nil, fmt.Errorf("%s not found", f[0])
			}
			if strings.HasPrefix(f[2], "/") {
				libs = append(libs, f[2])
			}
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0])
		}
	}
	return libs, sc.Err()
}
