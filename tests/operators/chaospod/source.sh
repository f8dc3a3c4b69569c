#!/usr/bin/env bash
# Lays out controller-runtime's example operator (examples/crd of the module
# sigs.k8s.io/controller-runtime, at the version go.mod.build requires) with palisade's
# leader election in DIR (emptied first), for `make chaospod-image` to build:
#   - main.go: the example's, copied from the Go module cache (`go mod download` fetches
#     the module from the module proxy and checks it against go.sum.build), and patched
#     with main.go.patch (applied with patch, which fails if the example's main.go no
#     longer matches): it makes and starts its manager through leadership.go;
#   - its package pkg (the ChaosPod type) is not copied: main.go imports it as
#     sigs.k8s.io/controller-runtime/examples/crd/pkg, which the build takes from the
#     module as it is;
#   - leadership.go: --election=client-go|palisade and the Lease's flags;
#   - go.mod.build, go.sum.build as go.mod and go.sum, palisade's Go clients replaced
#     with this checkout's clients/go and clients/go/kube.
# Nothing else of the operator changes.
set -euo pipefail

dir=${1:?usage: source.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)

rm -rf "$dir"
mkdir -p "$dir"
cp "$here/leadership.go" "$dir/"
cp "$here/go.mod.build" "$dir/go.mod"
cp "$here/go.sum.build" "$dir/go.sum"
cd "$dir"
version=$(go list -m -f '{{.Version}}' sigs.k8s.io/controller-runtime) ||
  { echo "source.sh: go.mod.build requires no sigs.k8s.io/controller-runtime" >&2; exit 1; }
module=$(go mod download -json "sigs.k8s.io/controller-runtime@$version" | jq -r '.Dir // empty') ||
  { echo "source.sh: go mod download sigs.k8s.io/controller-runtime@$version failed" >&2; exit 1; }
[[ -f $module/examples/crd/main.go ]] ||
  { echo "source.sh: sigs.k8s.io/controller-runtime@$version has no examples/crd/main.go (in ${module:-the module cache})" >&2; exit 1; }
# The module cache is read-only: the copy is made writable for patch.
cp "$module/examples/crd/main.go" main.go
chmod u+w main.go
patch --batch --forward --quiet -p1 <"$here/main.go.patch" ||
  { echo "source.sh: main.go.patch does not apply to examples/crd/main.go of sigs.k8s.io/controller-runtime@$version" >&2; exit 1; }
rm -f main.go.orig main.go.rej
go mod edit \
  -replace "github.com/palisade-dev/palisade/clients/go=$root/clients/go" \
  -replace "github.com/palisade-dev/palisade/clients/go/kube=$root/clients/go/kube"
