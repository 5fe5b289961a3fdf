// Command kurma-acbuild builds, signs and converts the small images Kurma's
// build and tests use:
//
//	kurma-acbuild keygen -o PREFIX                 PREFIX.key (0600), PREFIX.pub
//	kurma-acbuild build -o OUT.aci --name NAME [--exec "CMD ARGS"] [--label k=v]...
//	      [--env K=V]... [--user U --group G] [--workdir DIR] [--port NAME:PROTO:PORT]...
//	      [--dep ID|NAME]... [--gzip] --add SRC:DST...
//	kurma-acbuild sign --key PREFIX.key OUT.aci    writes OUT.aci.sig
//	kurma-acbuild id OUT.aci                       prints the image ID
//	kurma-acbuild oci-layout -o DIR (--from-aci X.aci | --name N --add SRC:DST...)
//	      [--tag NAME:TAG] [--tarball]             OCI layout dir, or docker-save tar with --tarball
//
// Builds are deterministic: the same inputs give the same image ID. Used by
// hack/build-images.sh (build_aci, sign_aci) and tests. It holds no state
// and no locks; it must not import the pod manager or the API.
//
// Must not import: `kurma.dev/kurma/internal/pod/...`,
// `kurma.dev/kurma/internal/api/...`.
package main
