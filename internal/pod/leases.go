package pod

import (
	"context"

	"kurma.dev/kurma/pkg/appc"
)

// leaseKept leases again, at recovery, the app images of a pod that stays
// (any state but Creating, which is rolled back) and had leased them. The
// image store keeps leases in files it does not fsync (docs/images.md), so
// a machine crash may lose a lease whose pod record survived; this puts it
// back before anyone can remove those images. Leases add up, so a lease
// that survived is left as it was and nothing is written. The stager image
// is not in the record and is not leased again: no stager outlives the
// crash that lost its lease. An image no longer in the store is skipped
// with a warning, and a failure only warns: it must not keep kurmad from
// starting.
func (r *Runtime) leaseKept(ctx context.Context, rec *record) {
	if !rec.Leased || rec.Pod.State == Creating {
		return
	}
	var ids []string
	for _, a := range rec.Pod.Apps {
		if !appc.ValidImageID(a.ImageID) {
			continue // not a full ID: never match another image by prefix
		}
		if _, err := r.opts.Images.Get(ctx, a.ImageID); err != nil {
			r.log.Warn("image of a recovered pod", "pod", rec.Pod.UUID, "image", a.ImageID, "err", err)
			continue
		}
		ids = append(ids, a.ImageID)
	}
	if len(ids) == 0 {
		return
	}
	if err := r.opts.Images.Lease(ctx, rec.Pod.UUID, ids...); err != nil {
		r.log.Warn("lease images of a recovered pod", "pod", rec.Pod.UUID, "err", err)
	}
}
