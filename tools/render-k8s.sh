#!/usr/bin/env bash
# Renders charts/ddp-trainer with its default values into plain manifests for kubectl-only
# users: k8s/ddp-trainer.yaml (the job as a PyTorchJob) and k8s/monitoring.yaml (PodMonitor,
# PrometheusRule, Grafana dashboard), and both again for a Kubeflow Trainer v2 TrainJob
# (apiKind=TrainJob): k8s/ddp-trainer-trainjob.yaml and k8s/monitoring-trainjob.yaml. `make k8s`
# runs it; tests/chart/test_k8s_manifests.py fails when the committed files differ from a fresh
# render.
#   usage: tools/render-k8s.sh [OUTPUT_DIR]   (default: k8s/)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$repo/k8s}"
helm="${HELM:-}"
if [[ -z "$helm" ]]; then
  if [[ -x "$repo/.tools/bin/helm" ]]; then helm="$repo/.tools/bin/helm"
  else helm="$(command -v helm || true)"; fi
fi
[[ -n "$helm" && -x "$helm" ]] || { echo "render-k8s.sh: ERROR: helm not found: run \`make tools\`" >&2; exit 1; }

release=ddp-trainer
namespace=ddp-trainer
mkdir -p "$out"

render() {  # render OUTPUT_FILE [--set KEY=VALUE] TEMPLATE...
  local file="$1"; shift
  local args=() values="default values"
  if [[ "${1:-}" == --set ]]; then args+=(--set "$2"); values="default values but $2"; shift 2; fi
  for t in "$@"; do args+=(--show-only "templates/$t"); done
  {
    echo "# Generated from charts/ddp-trainer ($values, namespace $namespace) by"
    echo "# tools/render-k8s.sh: do not edit; change the chart and run \`make k8s\`."
    "$helm" template "$release" "$repo/charts/ddp-trainer" --namespace "$namespace" "${args[@]}" \
      | sed -e 's/^\(\s*app.kubernetes.io\/managed-by:\) Helm$/\1 kubectl/'
  } > "$file.tmp"
  mv -f "$file.tmp" "$file"
}

render "$out/ddp-trainer.yaml" serviceaccount.yaml configmap.yaml pytorchjob.yaml
render "$out/ddp-trainer-trainjob.yaml" --set apiKind=TrainJob serviceaccount.yaml configmap.yaml \
  trainjob.yaml
render "$out/monitoring.yaml" podmonitor.yaml prometheusrule.yaml dashboard-configmap.yaml
render "$out/monitoring-trainjob.yaml" --set apiKind=TrainJob podmonitor.yaml prometheusrule.yaml \
  dashboard-configmap.yaml
echo "render-k8s.sh: wrote $out/ddp-trainer.yaml $out/monitoring.yaml $out/ddp-trainer-trainjob.yaml" \
  "$out/monitoring-trainjob.yaml"
