package boltstore

import (
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// Trimming the mapping.
//
// bbolt reads through a shared, read-only mmap of the whole file and
// writes with pwrite. Every page a read has touched stays mapped in this
// process until the file is unmapped, and a store of a million ports is
// 1.7 GB, all of it mapped after open (MAP_POPULATE and the freelist
// rebuild) and again after any full scan. Writing back pages that are also
// mapped costs the kernel an rmap walk and page-table work per page at
// every fdatasync, which showed in the create-to-UP latency of a large
// store (figures in bench/controller/README.md).
//
// So the store drops the mapping's page-table entries with
// MADV_DONTNEED: right after open, after any scan or bulk load of at least
// trimAfterKeys keys, and every trimInterval while writes come in (each
// commit maps the leaf pages on its path). On a shared file mapping this
// only unmaps: the pages stay in the page cache, and the next read of one
// takes a minor fault that maps it again.

const (
	// trimAfterKeys is the scan length after which the mapping is trimmed.
	trimAfterKeys = 16384
	// trimInterval is how often a store with new writes trims.
	trimInterval = 2 * time.Second
)

// scanned asks the trimmer to run if a read visited n keys.
func (s *Store) scanned(n int) {
	if n < trimAfterKeys {
		return
	}
	select {
	case s.trimReq <- struct{}{}:
	default: // one is already pending
	}
}

// trimmer trims on request and every interval in which the revision moved,
// until Close.
func (s *Store) trimmer(interval time.Duration) {
	defer close(s.trimDone)
	t := time.NewTicker(interval)
	defer t.Stop()
	last := s.rev.Load()
	for {
		select {
		case <-s.quit:
			return
		case <-s.trimReq:
		case <-t.C:
			if s.rev.Load() == last {
				continue
			}
		}
		last = s.rev.Load()
		s.trim()
	}
}

// trim drops the page-table entries of the used part of the mapping. It
// holds a read transaction so bbolt cannot remap meanwhile (a remap waits
// for every read transaction). Failure only costs speed, so it is logged.
func (s *Store) trim() {
	start := time.Now()
	var size int64
	err := s.db.View(func(tx *bolt.Tx) error {
		size = tx.Size() // pages in use: never beyond the mapping
		data := s.db.Info().Data
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, data, uintptr(size), unix.MADV_DONTNEED); errno != 0 {
			return errno
		}
		return nil
	})
	if err != nil {
		s.log.Warn("store: trim mapping", "err", err)
		return
	}
	s.log.Debug("store: trimmed mapping", "bytes", size, "took", time.Since(start))
}
