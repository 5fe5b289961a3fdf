package pod

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// The trash.
//
// A removed pod's folder holds its stager's root (the overlay's upper
// layer with the apps' folders, logs and state): deleting it file by file
// took about half of a `kurma run --rm`'s removal. So removeFiles renames
// the folder into <pods>/.trash, which is one rename on the same file
// system, and a goroutine deletes it from there; the pod is gone from
// <pods> when Remove returns. Close waits for those deletions and removes
// the empty trash; a trash left by a daemon that died meanwhile is emptied
// when the next one opens the pods folder, before it looks at any pod.

// trashDir is the trash's name in the pods folder. It is not a UUID, so
// no pod folder can have it.
const trashDir = ".trash"

// discard moves dir into the trash and deletes it in the background; when
// the Runtime is closed (nothing would wait for the deletion) it deletes
// dir at once. A missing dir is not an error.
func (r *Runtime) discard(dir string) error {
	if _, err := os.Lstat(dir); os.IsNotExist(err) {
		return nil
	}
	if !r.startWork() {
		return os.RemoveAll(dir)
	}
	trash := filepath.Join(r.opts.PodsDir, trashDir)
	to := filepath.Join(trash, filepath.Base(dir)+"."+strconv.FormatUint(r.trashSeq.Add(1), 10))
	err := os.Rename(dir, to)
	if os.IsNotExist(err) {
		// No trash yet (a pods folder from before it, or emptied and
		// removed): make it and try once more.
		if err = os.Mkdir(trash, 0o700); err == nil || os.IsExist(err) {
			err = os.Rename(dir, to)
		}
	}
	if err != nil {
		r.wg.Done()
		// Another file system under the pods folder, say: delete in place.
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

// emptyTrash deletes what a previous daemon left in the trash, detaching
// any mount found there first.
func (r *Runtime) emptyTrash() error {
	trash := filepath.Join(r.opts.PodsDir, trashDir)
	if _, err := os.Lstat(trash); os.IsNotExist(err) {
		return nil
	}
	if err := unmountUnder(trash); err != nil {
		return err
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("empty the trash: %w", err)
	}
	return nil
}
