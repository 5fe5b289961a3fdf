package stager

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"kurma.dev/kurma/pkg/kerrors"
)

// Identity is the resolved credentials of a process started in an app.
type Identity struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
	// Home is the user's home directory from the app's /etc/passwd, or "/".
	Home string `json:"home"`
}

// ResolveIdentity resolves user and group as the stager spec says: a name
// in the rootfs' /etc/passwd or /etc/group first, then a numeric ID, and a
// value starting with "/" means the owner (or group) of that file inside
// rootfs. supp are appended as supplementary GIDs.
func ResolveIdentity(rootfs, user, group string, supp []int) (Identity, error) {
	id := Identity{Home: "/"}
	if user == "" || group == "" {
		return id, kerrors.New(kerrors.Invalid, "user and group are required")
	}
	uid, home, err := resolveUser(rootfs, user)
	if err != nil {
		return id, err
	}
	gid, err := resolveGroup(rootfs, group)
	if err != nil {
		return id, err
	}
	id.UID, id.GID = uid, gid
	if home != "" {
		id.Home = home
	}
	for _, g := range supp {
		if g < 0 || int64(g) > 0xFFFFFFFE {
			return id, kerrors.New(kerrors.Invalid, "supplementary GID %d out of range", g)
		}
		id.Groups = append(id.Groups, uint32(g))
	}
	return id, nil
}

func resolveUser(rootfs, user string) (uint32, string, error) {
	if strings.HasPrefix(user, "/") {
		st, err := statInRoot(rootfs, user)
		if err != nil {
			return 0, "", fmt.Errorf("user %q: %w", user, err)
		}
		return st.Uid, "", nil
	}
	if f, err := os.Open(filepath.Join(rootfs, "etc", "passwd")); err == nil {
		defer f.Close()
		if uid, home, ok := lookupColonFile(f, user, true); ok {
			return uid, home, nil
		}
	}
	if n, err := strconv.ParseUint(user, 10, 32); err == nil {
		home := ""
		if f, err := os.Open(filepath.Join(rootfs, "etc", "passwd")); err == nil {
			defer f.Close()
			home = homeOfUID(f, uint32(n))
		}
		return uint32(n), home, nil
	}
	return 0, "", kerrors.New(kerrors.NotFound, "user %q not found in the app's /etc/passwd", user)
}

func resolveGroup(rootfs, group string) (uint32, error) {
	if strings.HasPrefix(group, "/") {
		st, err := statInRoot(rootfs, group)
		if err != nil {
			return 0, fmt.Errorf("group %q: %w", group, err)
		}
		return st.Gid, nil
	}
	if f, err := os.Open(filepath.Join(rootfs, "etc", "group")); err == nil {
		defer f.Close()
		if gid, _, ok := lookupColonFile(f, group, false); ok {
			return gid, nil
		}
	}
	if n, err := strconv.ParseUint(group, 10, 32); err == nil {
		return uint32(n), nil
	}
	return 0, kerrors.New(kerrors.NotFound, "group %q not found in the app's /etc/group", group)
}

// lookupColonFile finds name in a passwd- or group-format file and returns
// the third field (the ID) and, for passwd, the sixth (home).
func lookupColonFile(r io.Reader, name string, passwd bool) (uint32, string, bool) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) < 3 || f[0] != name {
			continue
		}
		n, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			continue
		}
		home := ""
		if passwd && len(f) >= 6 {
			home = f[5]
		}
		return uint32(n), home, true
	}
	return 0, "", false
}

func homeOfUID(r io.Reader, uid uint32) string {
	sc := bufio.NewScanner(r)
	want := strconv.FormatUint(uint64(uid), 10)
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) >= 6 && f[2] == want {
			return f[5]
		}
	}
	return ""
}

// statInRoot stats an absolute path inside rootfs, resolving symlinks as if
// rootfs were "/".
func statInRoot(rootfs, p string) (*syscall.Stat_t, error) {
	host, err := SecureJoin(rootfs, p)
	if err != nil {
		return nil, err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(host, &st); err != nil {
		return nil, kerrors.New(kerrors.NotFound, "stat %s: %v", p, err)
	}
	return &st, nil
}

// SecureJoin returns the host path of p inside root, following symlinks
// component by component so that none of them can lead outside root. The
// final component need not exist.
func SecureJoin(root, p string) (string, error) {
	const maxLinks = 40
	links := 0
	parts := strings.Split(filepath.Clean("/"+p), "/")
	cur := "/" // path inside root, always clean and absolute
	for i := 0; i < len(parts); i++ {
		c := parts[i]
		if c == "" || c == "." {
			continue
		}
		if c == ".." {
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		links++
		if links > maxLinks {
			return "", kerrors.New(kerrors.Invalid, "too many symlinks in %q", p)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", fmt.Errorf("readlink: %w", err)
		}
		if !strings.HasPrefix(target, "/") {
			target = filepath.Join(cur, target)
		}
		rest := append(strings.Split(filepath.Clean(target), "/"), parts[i+1:]...)
		parts = rest
		cur = "/"
		i = -1
	}
	return filepath.Join(root, cur), nil
}
