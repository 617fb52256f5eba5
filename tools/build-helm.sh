#!/usr/bin/env bash
# Builds the helm CLI from the Go module pinned in tools/helm (helm.sh/helm/v3) into a cache
# outside the checkout, keyed by version; skips it when already built. The chart tests
# (tests/e2e/test_helm.py) run it against the test API server. Next to it, in
# cert-manager-crds/, the Certificate and Issuer CRDs of the pinned cert-manager release,
# taken from its Go module (github.com/cert-manager/cert-manager, deploy/crds), so the chart's
# cert-manager objects are checked against the real schema.
#   cache: $GPU_BINDER_CACHE, else $XDG_CACHE_HOME/gpu-binder, else ~/.cache/gpu-binder
# Prints the directory holding `helm` and `cert-manager-crds/` on its last line of stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod="$here/helm"
modver() { awk -v m="$1" '$1=="require"{$1=""; $0=$0} $1==m{print $2; exit}' "$mod/go.mod"; }
helm_version="$(modver helm.sh/helm/v3)"
client_go="$(modver k8s.io/client-go)"
if [ -z "$helm_version" ] || [ -z "$client_go" ]; then
  echo "build-helm: cannot read the helm/client-go versions from $mod/go.mod" >&2; exit 2
fi
cert_manager_version=v1.21.2
cache="${GPU_BINDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-binder}"
out="$cache/helm/helm-${helm_version}_client-go-${client_go}"

if ! command -v go >/dev/null 2>&1; then
  for g in /usr/local/go/bin/go /usr/lib/go/bin/go; do [ -x "$g" ] && PATH="$(dirname "$g"):$PATH" && break; done
fi
if ! command -v go >/dev/null 2>&1; then
  echo "build-helm: Go is not installed (need Go >= 1.26 on PATH); cannot build helm" >&2
  exit 2
fi
export GOFLAGS=-modcacherw GOTOOLCHAIN=local CGO_ENABLED=0
export GONOSUMDB="${GONOSUMDB:-k8s.io,sigs.k8s.io,go.etcd.io,helm.sh}"
mkdir -p "$out"
# One build at a time per cache (as tools/build-controlplane.sh): a second caller waits.
exec 9>"$out/.build.lock"
if ! flock -n 9; then
  echo "build-helm: another build into $out is running; waiting for it ..." >&2
  flock 9
fi

cert_manager_crds() {
  local crds="$out/cert-manager-crds"
  [ "$(cat "$crds/VERSION" 2>/dev/null)" = "$cert_manager_version" ] && return 0
  local dir
  # outside any module: a plain module download, verified against the checksum database
  dir="$(cd / && GO111MODULE=on go mod download -json "github.com/cert-manager/cert-manager@$cert_manager_version" |
         awk -F'"' '$2=="Dir"{print $4}')" || true
  if [ -z "$dir" ] || [ ! -f "$dir/deploy/crds/cert-manager.io_certificates.yaml" ]; then
    echo "build-helm: cannot download github.com/cert-manager/cert-manager@$cert_manager_version from the Go module proxy" >&2; exit 3
  fi
  rm -rf "$crds" && mkdir -p "$crds"
  cp "$dir/deploy/crds/cert-manager.io_certificates.yaml" "$dir/deploy/crds/cert-manager.io_issuers.yaml" \
     "$dir/deploy/crds/cert-manager.io_clusterissuers.yaml" "$crds/"
  echo "$cert_manager_version" > "$crds/VERSION"
}

if [ -x "$out/helm" ]; then
  [ -n "${GPU_BINDER_BUILD_VERBOSE:-}" ] && echo "build-helm: helm already built ($out/helm)" >&2
  cert_manager_crds
  echo "$out"; exit 0
fi

( cd "$mod" && go mod download ) || {
  echo "build-helm: cannot download Go modules; is the Go module proxy reachable (GOPROXY=$(go env GOPROXY))?" >&2; exit 3; }
# The same ldflags as helm's own Makefile: the version, and the Kubernetes version that
# `helm lint` and `.Capabilities` assume (client-go v0.X.Y -> 1.X).
minor="$(echo "$client_go" | cut -d. -f2)"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${helm_version} -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags="$ldflags -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$minor"
done
echo "build-helm: building helm ${helm_version} from helm.sh/helm/v3/cmd/helm (a cold build takes minutes on 2 cores) ..." >&2
start=$SECONDS
( cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$out/helm.tmp" helm.sh/helm/v3/cmd/helm ) || {
  echo "build-helm: building helm failed; is the Go module proxy reachable (GOPROXY=$(go env GOPROXY))?" >&2
  rm -f "$out/helm.tmp"; exit 3; }
mv "$out/helm.tmp" "$out/helm"
echo "build-helm: helm built in $((SECONDS-start)) s" >&2
cert_manager_crds
echo "$out"
