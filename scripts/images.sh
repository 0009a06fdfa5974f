#!/usr/bin/env bash
# make images: one container image per service and the CLI.
#
#   scripts/images.sh                 release binaries built on this host, on a
#                                     runtime base assembled from Debian packages
#   scripts/images.sh --from-source   the multi-stage deploy/Dockerfile (needs a
#                                     registry for its base images, and BuildKit)
#
# Both give the same images: the runtime stages of deploy/Dockerfile (layout,
# USER 65532:65532, ENV, EXPOSE, ENTRYPOINT) are the only definition of an
# image; from the host they are used as they are, with `COPY --from=builder
# /out/X` read as `COPY X` from a context holding the host's binaries.
#
# The host-built path needs no registry: the base (glibc, libgcc, CA
# certificates, tzdata, a user and group 65532 "nonroot", no shell) is
# unpacked from this host's Debian packages (`apt-get download`,
# `dpkg-deb -x`) and imported with `docker import` as
# threadline-runtime-base:<suite>-<hash of the package versions>; it is made
# once and reused until a package version changes. The host must be Debian
# or a derivative no newer than the packages it downloads (the binaries link
# against the host's glibc, the base carries the same one).
#
# Tags: threadline-<target>:dev (what deploy/k8s/overlays/dev uses) and
# threadline-<target>:<workspace version> (what production pushes, renamed).
# IMAGE_TAGS overrides the list ("dev 0.1.0").
#
# Exit status 3: images cannot be built on this machine (no Docker engine
# answers; no Debian packages for the base); other failures exit 1.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

say() { printf 'images: %s\n' "$*"; }
die() { printf 'images: FAIL: %s\n' "$*" >&2; exit 1; }
cannot() { printf 'images: cannot build here: %s\n' "$*" >&2; exit 3; }

# The images, in deploy/Dockerfile's target names; each is threadline-<target>.
TARGETS=(gateway context-builder inference publisher cli slack-sim)
version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)"
[[ -n "$version" ]] || die "no [workspace.package] version in Cargo.toml"
read -r -a tags <<<"${IMAGE_TAGS:-dev $version}"

docker info >/dev/null 2>&1 \
  || cannot "no Docker engine answers (docker info); start one (scripts/docker-engine.sh up starts Debian's dockerd)"

from_source=0
case "${1:-}" in
  "") ;;
  --from-source) from_source=1 ;;
  -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument $1 (--from-source or nothing)" ;;
esac

tag_args() { local t; for t in "${tags[@]}"; do printf -- '-t\nthreadline-%s:%s\n' "$1" "$t"; done; }

if (( from_source )); then
  for target in "${TARGETS[@]}"; do
    say "building threadline-$target from source (deploy/Dockerfile, target $target)"
    mapfile -t t < <(tag_args "$target")
    DOCKER_BUILDKIT=1 docker build -f deploy/Dockerfile --target "$target" "${t[@]}" . \
      || die "docker build --target $target (deploy/Dockerfile needs BuildKit and registry access)"
  done
  say "ok: ${TARGETS[*]/#/threadline-} tagged ${tags[*]}"
  exit 0
fi

# Release binaries ----------------------------------------------------------
command -v cargo >/dev/null || die "cargo not found: install Rust (https://rustup.rs)"
say "building the release binaries (cargo build --release; the first build takes a while)"
cargo build --release --locked -p threadline-gateway -p threadline-context-builder \
  -p threadline-inference -p threadline-publisher -p threadline-cli -p threadline-slack-sim
bin="${CARGO_TARGET_DIR:-$root/target}/release"

# Runtime base ---------------------------------------------------------------
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
  || cannot "the runtime base is made from Debian packages (apt-get, dpkg-deb), not found here; use --from-source where a registry is reachable"
PACKAGES=(libc6 libgcc-s1 ca-certificates tzdata)
# The versions installed here (the binaries were linked against this glibc),
# else apt's candidate.
versions=()
for p in "${PACKAGES[@]}"; do
  v="$(dpkg-query -W -f '${Version}' "$p" 2>/dev/null || true)"
  [[ -n "$v" ]] || v="$(apt-cache policy "$p" | awk '/Candidate:/ {print $2}')"
  [[ -n "$v" && "$v" != "(none)" ]] || cannot "apt knows no version of $p (apt-get update?)"
  versions+=("$p=$v")
done
# Bump when the way the base is assembled below changes.
RECIPE=2
suite="$(. /etc/os-release && echo "${ID:-debian}${VERSION_ID:-}")"
base="threadline-runtime-base:${suite}-$(printf '%s ' "recipe=$RECIPE" "${versions[@]}" | sha256sum | cut -c1-12)"
if docker image inspect "$base" >/dev/null 2>&1; then
  say "runtime base $base is already here"
else
  say "assembling the runtime base $base from ${versions[*]}"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  # apt-get download writes to the current directory; as root it warns that
  # the _apt user cannot reach a private mktemp folder: harmless.
  # (An installed version the archive no longer has: its successor, which
  # is newer, so its glibc still runs the binaries.)
  for pv in "${versions[@]}"; do
    p="${pv%%=*}"
    (cd "$work" && { apt-get download -q "$pv" || apt-get download -q "$p"; } 2>&1 | grep -v 'unsandboxed' >&2 || true)
    compgen -G "$work/${p}_*.deb" >/dev/null || cannot "apt-get download $p failed (package index unreachable?)"
  done
  fs="$work/rootfs"
  mkdir -p "$fs"
  for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$fs"; done
  rm -rf "$fs"/usr/share/{doc,man,lintian,info} "$fs"/usr/sbin "$fs"/usr/bin "$fs"/sbin "$fs"/bin
  # ca-certificates builds its bundle in a maintainer script dpkg-deb does
  # not run: make it the same way (every certificate Mozilla trusts).
  mkdir -p "$fs/etc/ssl/certs"
  cat "$fs"/usr/share/ca-certificates/mozilla/*.crt >"$fs/etc/ssl/certs/ca-certificates.crt"
  [[ -s "$fs/etc/ssl/certs/ca-certificates.crt" ]] || die "no CA certificates in the ca-certificates package"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$fs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$fs/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$fs/etc/nsswitch.conf"
  ln -sf /usr/share/zoneinfo/Etc/UTC "$fs/etc/localtime"
  mkdir -p "$fs/tmp" "$fs/home/nonroot"
  chmod 1777 "$fs/tmp"
  # Every file root's, whoever runs this (the root filesystem is read-only
  # at run time; /home/nonroot is only the working directory).
  tar --numeric-owner --owner=0 --group=0 -C "$fs" -c . | docker import \
    --change 'USER 65532:65532' --change 'WORKDIR /home/nonroot' \
    --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
    --message "threadline runtime base: ${versions[*]}" - "$base" >/dev/null \
    || die "docker import of the runtime base failed"
fi

# Images -----------------------------------------------------------------------
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx" "${work:-}"' EXIT
# The runtime stages of deploy/Dockerfile, from its runtime base on.
awk '/^FROM \$\{RUNTIME_IMAGE\} AS runtime/ {on = 1} on' deploy/Dockerfile \
  | sed 's#^COPY --from=builder /out/#COPY #' >"$ctx/Dockerfile"
grep -q '^FROM ${RUNTIME_IMAGE} AS runtime' "$ctx/Dockerfile" \
  || die "deploy/Dockerfile has no 'FROM \${RUNTIME_IMAGE} AS runtime' stage"
if grep -q -- '--from=' "$ctx/Dockerfile"; then
  die "a runtime stage of deploy/Dockerfile copies from a stage other than builder's /out"
fi
sed -i "1i ARG RUNTIME_IMAGE" "$ctx/Dockerfile"
for b in threadline-gateway threadline-context-builder threadline-inference threadline-publisher \
         threadline threadline-slack-sim; do
  cp "$bin/$b" "$ctx/"
done
# The legacy builder needs no BuildKit and reads only this context; BuildKit
# (where installed) builds the same file the same way.
builder=()
docker buildx version >/dev/null 2>&1 || builder=(env DOCKER_BUILDKIT=0)
for target in "${TARGETS[@]}"; do
  mapfile -t t < <(tag_args "$target")
  # Its output only on failure (the legacy builder warns that it is deprecated).
  "${builder[@]}" docker build -q --build-arg RUNTIME_IMAGE="$base" --target "$target" "${t[@]}" "$ctx" \
    >"$ctx/build.log" 2>&1 || { cat "$ctx/build.log" >&2; die "docker build --target $target"; }
  say "threadline-$target:${tags[0]} $(docker image inspect -f '{{.Config.User}} {{json .Config.Entrypoint}} {{.Size}}' "threadline-$target:${tags[0]}" \
    | awk '{printf "user %s, entrypoint %s, %.0f MB", $1, $2, $3 / 1e6}')"
done
say "ok: ${TARGETS[*]/#/threadline-} tagged ${tags[*]} (base $base)"
