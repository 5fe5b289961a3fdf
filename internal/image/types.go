package image

import "kurma.dev/kurma/internal/image/imagetypes"

// The store's types live in the leaf package imagetypes (see its doc);
// these aliases keep their names here.
type (
	Image       = imagetypes.Image
	Progress    = imagetypes.Progress
	PullOptions = imagetypes.PullOptions
	Layer       = imagetypes.Layer
	Store       = imagetypes.Store
)
