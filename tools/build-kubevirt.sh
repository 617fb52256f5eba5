#!/usr/bin/env bash
# Builds KubeVirt's virt-controller and virt-api (tools/kubevirt, kubevirt.io/kubevirt pinned there),
# KWOK (tools/kwok, sigs.k8s.io/kwok pinned there), and writes the manifests KubeVirt's own code
# generates (CRDs, RBAC, virt-api webhooks) and KWOK's stages, into a cache outside the checkout,
# keyed by version. Skips what is already built.
#   cache: $GPU_BINDER_CACHE, else $XDG_CACHE_HOME/gpu-binder, else ~/.cache/gpu-binder
# Prints the directory holding them on its last line of stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
kvmod="$here/kubevirt"
kwokmod="$here/kwok"
kv_version="$(awk '$1=="kubevirt.io/kubevirt"{print $2; exit}' "$kvmod/go.mod")"
kwok_version="$(awk '$1=="require" && $2=="sigs.k8s.io/kwok"{print $3; exit}' "$kwokmod/go.mod")"
cache="${GPU_BINDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-binder}"
out="$cache/kubevirt/kubevirt-${kv_version}_kwok-${kwok_version}"

if ! command -v go >/dev/null 2>&1; then
  for g in /usr/local/go/bin/go /usr/lib/go/bin/go; do [ -x "$g" ] && PATH="$(dirname "$g"):$PATH" && break; done
fi
if ! command -v go >/dev/null 2>&1; then
  echo "build-kubevirt: Go is not installed (need Go >= 1.26 on PATH); cannot build virt-controller/virt-api/kwok" >&2
  exit 2
fi
export GOFLAGS=-modcacherw GOTOOLCHAIN=local CGO_ENABLED=0
# kubevirt.io is not in the checksum DB; github.com/rhobs/operator-observability-toolkit v0.0.30 neither.
export GONOSUMDB="${GONOSUMDB:-k8s.io,sigs.k8s.io,go.etcd.io,kubevirt.io,github.com/rhobs}"
mkdir -p "$out"
# One build at a time per cache, as tools/build-controlplane.sh: a second caller (a helper's test
# session, `make demo`) waits for the first instead of moving the same .tmp files from under it.
exec 9>"$out/.build.lock"
flock 9

build() { # module-dir name=package ...: the missing ones in one `go build` (as
  # tools/build-controlplane.sh: packages load once, one binary links while the next compiles)
  local mod="$1" names=() pkgs=() spec name start dest
  shift
  for spec in "$@"; do
    name="${spec%%=*}"
    if [ -x "$out/$name" ]; then
      [ -n "${GPU_BINDER_BUILD_VERBOSE:-}" ] && echo "build-kubevirt: $name already built ($out/$name)" >&2
      continue
    fi
    names+=("$name"); pkgs+=("${spec#*=}")
  done
  [ ${#names[@]} -gt 0 ] || return 0
  echo "build-kubevirt: building ${names[*]} from ${pkgs[*]} (cold builds take 1-5 min on 2 cores) ..." >&2
  start=$SECONDS
  rm -rf "$out/.tmp" && mkdir -p "$out/.tmp"
  # -o DIR/ names each binary after its package's last path element (the names given for
  # several packages must be those); one package is written to its name
  dest="$out/.tmp/"
  [ ${#pkgs[@]} -gt 1 ] || dest="$out/.tmp/${names[0]}"
  ( cd "$mod" && go mod download && go build -trimpath -ldflags "-s -w" -o "$dest" "${pkgs[@]}" ) || {
    echo "build-kubevirt: building ${names[*]} failed; is the Go module proxy reachable (GOPROXY=$(go env GOPROXY))?" >&2
    rm -rf "$out/.tmp"; exit 3; }
  for name in "${names[@]}"; do
    mv "$out/.tmp/$name" "$out/$name"
  done
  rm -rf "$out/.tmp"
  echo "build-kubevirt: ${names[*]} built in $((SECONDS-start)) s" >&2
}

build "$kvmod" virt-controller=kubevirt.io/kubevirt/cmd/virt-controller virt-api=kubevirt.io/kubevirt/cmd/virt-api \
  gen-manifests=./gen-manifests
build "$kwokmod" kwok=sigs.k8s.io/kwok/cmd/kwok

if [ ! -s "$out/kubevirt-manifests.json" ]; then
  "$out/gen-manifests" > "$out/kubevirt-manifests.json.tmp" && mv "$out/kubevirt-manifests.json.tmp" "$out/kubevirt-manifests.json"
fi
if [ ! -s "$out/kwok-stages.yaml" ]; then
  kwokdir="$(cd "$kwokmod" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  st="$kwokdir/kustomize/stage"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    [ -f "$st/$f" ] || { echo "build-kubevirt: KWOK stage $st/$f missing" >&2; exit 3; }
    cat "$st/$f"; printf '\n---\n'
  done > "$out/kwok-stages.yaml.tmp"
  mv "$out/kwok-stages.yaml.tmp" "$out/kwok-stages.yaml"
fi
echo "$out"
