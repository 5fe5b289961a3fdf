// Package tarx extracts tar streams from outside (image layers, ACIs) into a
// directory without ever writing outside it.
//
// Every file system operation goes through an os.Root opened on the target
// directory, so no path component, including a symbolic link created earlier
// by the same tarball, can lead outside it. On top of that, entry names that
// are absolute or contain a ".." component are refused outright with an
// error naming the entry, hard links must name an entry inside the target,
// and device nodes are refused unless the caller allows them. An existing
// entry is removed before a new one of the same name is created (O_EXCL), so
// a symlink left by an earlier entry is replaced, never written through.
//
// Whiteouts (Options.Whiteouts) are stored in overlayfs form so that a stager
// can stack layers with overlayfs directly:
//
//	.wh.NAME        -> NAME as a character device 0:0
//	.wh..wh..opq    -> the directory gets xattr trusted.overlay.opaque="y"
//
// A stager without overlayfs that copies layers bottom-up must treat a 0:0
// character device as "delete NAME from the layers below" and an opaque
// directory as "drop the lower layers' contents of this directory".
// Creating either needs root (CAP_MKNOD, CAP_SYS_ADMIN for trusted.*
// xattrs); without it a layer with whiteouts fails to extract. xattrs named
// trusted.overlay.* in a tarball are dropped, so a layer cannot forge
// overlayfs metadata (redirects, opaque flags) of its own.
//
// Ownership is kept when running as root (otherwise the caller's IDs are
// used); modes, modification times and xattrs (where the file system allows
// them) are kept. Extract is a pure function of its inputs: no locks, no
// state. The caller extracts into a fresh temporary directory and removes it
// when Extract fails, so a rejected tarball leaves nothing behind.
//
// Must not import: `kurma.dev/kurma/...` (except
// `kurma.dev/kurma/pkg/kerrors`).
package tarx
