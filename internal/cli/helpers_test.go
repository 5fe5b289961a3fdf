package cli

import "kurma.dev/kurma/internal/image"

func progressEv(ref, status string, cur, total int64) image.Progress {
	return image.Progress{Ref: ref, Status: status, Current: cur, Total: total}
}
