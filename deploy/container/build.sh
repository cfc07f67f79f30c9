#!/bin/sh
# Build the kvgate container image (kvgate, kvctl, enginesim) from the
# repository root. No Makefile needed.
#
#   deploy/container/build.sh                      # image kvgate:<git describe>
#   IMAGE=registry.example/kvgate TAG=v0.1.0 deploy/container/build.sh
#   PLATFORMS=linux/amd64,linux/arm64 PUSH=1 deploy/container/build.sh
#
# Environment: IMAGE (default kvgate), TAG (default: git describe), PLATFORMS
# (default: the builder's), PUSH=1 to push (needed for multi-platform), DOCKER
# (default docker; podman works too, without the cache mounts' speed-up).
set -eu

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

DOCKER=${DOCKER:-docker}
IMAGE=${IMAGE:-kvgate}
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
TAG=${TAG:-$version}
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)

set -- -f deploy/container/Dockerfile \
	--build-arg "VERSION=$TAG" --build-arg "REVISION=$revision" --build-arg "CREATED=$created" \
	-t "$IMAGE:$TAG"

if [ -n "${PLATFORMS:-}" ]; then
	# Multi-platform images need buildx and a registry to land in.
	if [ "${PUSH:-0}" = 1 ]; then out=--push; else out=--load; fi
	exec "$DOCKER" buildx build --platform "$PLATFORMS" "$out" "$@" .
fi

DOCKER_BUILDKIT=1 "$DOCKER" build "$@" .
if [ "${PUSH:-0}" = 1 ]; then
	"$DOCKER" push "$IMAGE:$TAG"
fi
echo "built $IMAGE:$TAG (revision $revision)"
