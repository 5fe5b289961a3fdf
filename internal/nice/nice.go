package nice

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Set gives every thread of this process the nice value n (-20 to 19;
// lower runs first). Threads made afterwards inherit it from the thread
// that makes them. Lowering it needs CAP_SYS_NICE.
func Set(n int) error {
	if n < -20 || n > 19 {
		return fmt.Errorf("nice %d: want -20 to 19", n)
	}
	// Twice: a thread the runtime starts during the first pass may have
	// been made by one not yet changed.
	for range 2 {
		tids, err := threads()
		if err != nil {
			return err
		}
		for _, tid := range tids {
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, n); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("nice %d: thread %d: %w", n, tid, err)
			}
		}
	}
	return nil
}

// Of returns the nice value of each thread of this process, by thread id.
func Of() (map[int]int, error) {
	tids, err := threads()
	if err != nil {
		return nil, err
	}
	out := map[int]int{}
	for _, tid := range tids {
		// The raw syscall returns 20 - nice, so that it is never negative.
		p, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
		if errors.Is(err, unix.ESRCH) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("thread %d: %w", tid, err)
		}
		out[tid] = 20 - p
	}
	return out, nil
}

func threads() ([]int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("list threads: %w", err)
	}
	var tids []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}
