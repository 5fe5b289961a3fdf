package pod

import (
	"fmt"
	"os"
	"path/filepath"
)

// The trash.
//
// A removed pod's folder holds its stager's root (the overlay's upper
// layer with the apps' folders, logs and state): deleting it file by file
// was a large part of a `kurma run --rm`'s removal. So removeFiles renames
// the folder into <pods>/.trash, which is one rename on the same file
// system, and a goroutine deletes it from there; the pod is gone from
// <pods> when Remove returns. The trash is made when first needed; Close
// waits for the deletions and removes the empty trash, and New deletes a
// trash a dead daemon left before it looks at any pod.

// trashDir is the trash's name in the pods folder. It is not a UUID, so
// no pod folder can have it.
const trashDir = ".trash"

func (r *Runtime) trashPath() string { return filepath.Join(r.opts.PodsDir, trashDir) }

// discard moves dir into the trash and deletes it in the background. Where
// that is not possible (the Runtime is closed, so nothing would wait for
// the deletion; the rename fails) it deletes dir at once. A missing dir is
// not an error.
func (r *Runtime) discard(dir string) error {
	if !r.startWork() {
		return os.RemoveAll(dir)
	}
	to := filepath.Join(r.trashPath(), filepath.Base(dir))
	err := os.Rename(dir, to)
	if err != nil {
		// No trash yet, most likely: make it and try once more.
		if merr := os.Mkdir(r.trashPath(), 0o700); merr == nil || os.IsExist(merr) {
			err = os.Rename(dir, to)
		}
	}
	if err != nil {
		r.wg.Done()
		if rerr := os.RemoveAll(dir); rerr != nil {
			return fmt.Errorf("%w (and moving it to the trash: %v)", rerr, err)
		}
		return nil
	}
	go func() {
		defer r.wg.Done()
		if err := os.RemoveAll(to); err != nil {
			r.log.Warn("empty the trash", "dir", to, "err", err)
		}
	}()
	return nil
}

// emptyTrash deletes the trash a previous daemon left, detaching any
// mount found in it first.
func (r *Runtime) emptyTrash() error {
	trash := r.trashPath()
	if err := unmountUnder(trash); err != nil {
		return err
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("empty the trash: %w", err)
	}
	return nil
}
