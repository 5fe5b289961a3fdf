package main

import "io"

// countBytes reads rc to its end, closes it and returns its length.
func countBytes(rc io.ReadCloser) (int64, error) {
	defer rc.Close()
	return io.Copy(io.Discard, rc)
}
