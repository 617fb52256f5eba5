#!/usr/bin/env bash
# Builds kube-apiserver, kubectl, kube-scheduler, kube-controller-manager and etcd from the Go module pinned in tools/controlplane
# into a cache outside the checkout, keyed by version. Skips what is already built.
#   cache: $GPU_BINDER_CACHE, else $XDG_CACHE_HOME/gpu-binder, else ~/.cache/gpu-binder
# Prints the directory holding the binaries on its last line of stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod="$here/controlplane"
k8s_version="$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' "$mod/go.mod")"
etcd_version="$(awk '$1=="go.etcd.io/etcd/server/v3"{print $2; exit}' "$mod/go.mod")"
cache="${GPU_BINDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-binder}"
out="$cache/controlplane/k8s-${k8s_version}_etcd-${etcd_version}"

if ! command -v go >/dev/null 2>&1; then
  for g in /usr/local/go/bin/go /usr/lib/go/bin/go; do [ -x "$g" ] && PATH="$(dirname "$g"):$PATH" && break; done
fi
if ! command -v go >/dev/null 2>&1; then
  echo "build-controlplane: Go is not installed (need Go >= 1.26 on PATH); cannot build kube-apiserver/etcd/kubectl" >&2
  exit 2
fi
export GOFLAGS=-modcacherw GOTOOLCHAIN=local CGO_ENABLED=0
export GONOSUMDB="${GONOSUMDB:-k8s.io,sigs.k8s.io,go.etcd.io}"
mkdir -p "$out"
# One build at a time per cache: a second caller (another test session, `make demo`) waits for
# the first instead of compiling the same binaries again into the same files.
exec 9>"$out/.build.lock"
if ! flock -n 9; then
  echo "build-controlplane: another build into $out is running; waiting for it ..." >&2
  flock 9
fi

build() { # ldflags name=package ...: the missing ones in one `go build` (packages load once,
  # and one binary links while the next compiles: on 2 cores a link alone leaves a core idle)
  local ldflags="$1" names=() pkgs=() spec name start
  shift
  for spec in "$@"; do
    name="${spec%%=*}"
    if [ -x "$out/$name" ]; then
      [ -n "${GPU_BINDER_BUILD_VERBOSE:-}" ] && echo "build-controlplane: $name already built ($out/$name)" >&2
      continue
    fi
    names+=("$name"); pkgs+=("${spec#*=}")
  done
  [ ${#names[@]} -gt 0 ] || return 0
  echo "build-controlplane: building ${names[*]} from ${pkgs[*]} (cold builds take 5-15 min on 2 cores) ..." >&2
  start=$SECONDS
  rm -rf "$out/.tmp" && mkdir -p "$out/.tmp"
  # -o DIR/ names each binary after its package's last path element (the names given for
  # several packages must be those); one package is written to its name
  local dest="$out/.tmp/"
  [ ${#pkgs[@]} -gt 1 ] || dest="$out/.tmp/${names[0]}"
  ( cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$dest" "${pkgs[@]}" ) || {
    echo "build-controlplane: building ${names[*]} failed; is the Go module proxy reachable (GOPROXY=$(go env GOPROXY))?" >&2
    rm -rf "$out/.tmp"; exit 3; }
  for name in "${names[@]}"; do
    mv "$out/.tmp/$name" "$out/$name"
  done
  rm -rf "$out/.tmp"
  echo "build-controlplane: ${names[*]} built in $((SECONDS-start)) s" >&2
}

( cd "$mod" && go mod download ) || {
  echo "build-controlplane: cannot download Go modules; is the Go module proxy reachable (GOPROXY=$(go env GOPROXY))?" >&2; exit 3; }
kv="-s -w -X k8s.io/component-base/version.gitVersion=${k8s_version} -X k8s.io/client-go/pkg/version.gitVersion=${k8s_version}"
build "-s -w" etcd=go.etcd.io/etcd/server/v3
build "$kv" kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kubectl=k8s.io/kubernetes/cmd/kubectl \
  kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager
echo "$out"
