#!/usr/bin/env bash
# Writes a one-layer image as a `docker save` archive, which `ctr images import` (and
# `docker load`) read: a layer tar, a config JSON and manifest.json with the tag.
# Written by hand because it is three files and a tar: no Debian tool builds an image
# from a directory without a daemon (buildah needs its own storage and user namespaces).
#
#   docker-archive.sh OUT.tar NAME:TAG ROOTFS_DIR CONFIG_JSON
#
# CONFIG_JSON is the image's "config" object, e.g. {"User":"65532:65532","Entrypoint":["/palisade"]}.
# The layer is reproducible: sorted names, mtime 0, numeric root ownership unless the
# rootfs files say otherwise.
set -euo pipefail
out=$1 tag=$2 rootfs=$3 config=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

tar --sort=name --mtime=@0 --numeric-owner --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -C "$rootfs" -cf "$work/layer.tar" .
layer=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
mkdir "$work/$layer"
mv "$work/layer.tar" "$work/$layer/layer.tar"

printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"tests/controlplane/images/docker-archive.sh"}]}' \
  "$config" "$layer" >"$work/config.json"
cfg=$(sha256sum "$work/config.json" | cut -d' ' -f1)
mv "$work/config.json" "$work/$cfg.json"
printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$cfg" "$tag" "$layer" >"$work/manifest.json"

tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work" -cf "$out.tmp" manifest.json "$cfg.json" "$layer"
mv "$out.tmp" "$out"
echo "wrote $out ($tag, layer sha256:${layer:0:12})" >&2
