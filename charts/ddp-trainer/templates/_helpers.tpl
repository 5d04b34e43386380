{{/*
Chart name, truncated to 63 characters.
*/}}
{{- define "ddp-trainer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name, which is also the PyTorchJob name. The operator names pods and headless Services
`<job>-<replica type>-<index>` and the job name must be a DNS-1035 label, so it is truncated to
48 characters (room for "-worker-" and a 7-digit index) and must start with a letter.
*/}}
{{- define "ddp-trainer.fullname" -}}
{{- $name := "" }}
{{- if .Values.fullnameOverride }}
{{- $name = .Values.fullnameOverride }}
{{- else }}
{{- $chart := default .Chart.Name .Values.nameOverride }}
{{- if contains $chart .Release.Name }}
{{- $name = .Release.Name }}
{{- else }}
{{- $name = printf "%s-%s" .Release.Name $chart }}
{{- end }}
{{- end }}
{{- $name = $name | trunc 48 | trimSuffix "-" }}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) }}
{{- fail (printf "fullnameOverride/release name: job name %q is not a DNS-1035 label (lowercase letters, digits and '-', starting with a letter); set fullnameOverride" $name) }}
{{- end }}
{{- $name }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "ddp-trainer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: stable across upgrades.
*/}}
{{- define "ddp-trainer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ddp-trainer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Common labels of every object.
*/}}
{{- define "ddp-trainer.labels" -}}
helm.sh/chart: {{ include "ddp-trainer.chart" . }}
{{ include "ddp-trainer.selectorLabels" . }}
app.kubernetes.io/version: {{ include "ddp-trainer.imageTag" . | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ddp-trainer
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Image tag (defaults to appVersion) and full image reference.
*/}}
{{- define "ddp-trainer.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "ddp-trainer.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "ddp-trainer.imageTag" .) }}
{{- end }}
{{- end }}

{{/*
ServiceAccount name.
*/}}
{{- define "ddp-trainer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ddp-trainer.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Ranks per pod: one per GPU, at least one.
*/}}
{{- define "ddp-trainer.nprocPerNode" -}}
{{- max 1 (int .Values.gpusPerReplica) }}
{{- end }}

{{/*
Whether the pod runs the elastic launcher (`ddp-trainer run`) or a single rank (`train`).
*/}}
{{- define "ddp-trainer.useLauncher" -}}
{{- if or .Values.elastic.enabled (gt (int .Values.gpusPerReplica) 1) }}true{{ end }}
{{- end }}

{{/*
Name of the PVC backing a volume ("" when none): include "ddp-trainer.claimName" (list $ "data")
*/}}
{{- define "ddp-trainer.claimName" -}}
{{- $root := index . 0 }}
{{- $key := index . 1 }}
{{- $p := index $root.Values.persistence $key }}
{{- if $p.existingClaim }}
{{- $p.existingClaim }}
{{- else if $p.create.enabled }}
{{- printf "%s-%s" (include "ddp-trainer.fullname" $root) $key }}
{{- end }}
{{- end }}

{{/*
`s3://<bucket>/<prefix>` of storage.s3 (the prefix defaulting to the release's full name), or
"" when no bucket is set. A bucket beside a checkpoints or outputs claim fails the render: the
trainer would write to the bucket and the claim would stay empty.
*/}}
{{- define "ddp-trainer.s3Url" -}}
{{- $s3 := .Values.storage.s3 }}
{{- if $s3.bucket }}
{{- range $key := list "checkpoints" "outputs" }}
{{- if include "ddp-trainer.claimName" (list $ $key) }}
{{- fail (printf "storage.s3.bucket is set and so is a persistence.%s claim: checkpoints and outputs go to the bucket (fix: drop persistence.%s.existingClaim/create.enabled, or unset storage.s3.bucket)" $key $key) }}
{{- end }}
{{- end }}
{{- $prefix := trimAll "/" (default (include "ddp-trainer.fullname" .) $s3.prefix) }}
{{- printf "s3://%s/%s" $s3.bucket $prefix }}
{{- end }}
{{- end }}

{{/*
The trainer config file: trainerConfig with the paths and the metrics port the pod provides.
*/}}
{{- define "ddp-trainer.trainerConfig" -}}
{{- $cfg := deepCopy (default dict .Values.trainerConfig) }}
{{- $s3 := include "ddp-trainer.s3Url" . }}
{{- $_ := set $cfg "checkpoint" (merge (dict "dir" "/checkpoints") (default dict $cfg.checkpoint)) }}
{{- $_ = set $cfg.checkpoint "dir" (ternary (printf "%s/checkpoints" $s3) "/checkpoints" (ne $s3 "")) }}
{{- $_ = set $cfg "output" (default dict $cfg.output) }}
{{- $_ = set $cfg.output "dir" (ternary (printf "%s/outputs" $s3) "/outputs" (ne $s3 "")) }}
{{- $_ = set $cfg "metrics" (default dict $cfg.metrics) }}
{{- $_ = set $cfg.metrics "port" (int .Values.metrics.port) }}
{{- /* Final values stay up for two scrapes; a stop is acted on well within the grace period. */}}
{{- if not (hasKey $cfg.metrics "linger_seconds") }}
{{- $_ = set $cfg.metrics "linger_seconds" (mul 2 (include "ddp-trainer.seconds" .Values.metrics.podMonitor.interval | int)) }}
{{- end }}
{{- $_ = set $cfg "train" (default dict $cfg.train) }}
{{- if not (hasKey $cfg.train "stop_check_seconds") }}
{{- $_ = set $cfg.train "stop_check_seconds" (max 1 (min 15 (div (int .Values.terminationGracePeriodSeconds) 4))) }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/*
Seconds of a Prometheus duration ("30s", "1m", "1h30m"; the schema checks its form), rounded
down; milliseconds are dropped.
*/}}
{{- define "ddp-trainer.seconds" -}}
{{- $total := 0 }}
{{- $units := dict "y" 31536000 "w" 604800 "d" 86400 "h" 3600 "m" 60 "s" 1 }}
{{- range $part := regexFindAll "[0-9]+(ms|[ywdhms])" . -1 }}
{{- if not (hasSuffix "ms" $part) }}
{{- $unit := regexFind "[ywdhms]$" $part }}
{{- $total = add $total (mul (trimSuffix $unit $part | int) (get $units $unit)) }}
{{- end }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
A Kubernetes quantity (the schema checks its form: 2, 0.5, "500m", "16Gi", "1e3") in thousandths
of its unit, as a decimal string: sprig's mulf multiplies in decimal, so "0.1" and "100m" are
equal.
*/}}
{{- define "ddp-trainer.milli" -}}
{{- $text := toString . }}
{{- $suffixes := dict "" 1000 "m" 1 "k" 1e6 "M" 1e9 "G" 1e12 "T" 1e15 "P" 1e18 "E" 1e21 "Ki" 1024e3 "Mi" 1048576e3 "Gi" 1073741824e3 "Ti" 1099511627776e3 "Pi" 1125899906842624e3 "Ei" 1152921504606846976e3 }}
{{- $number := regexFind "^[+]?([0-9]+[.]?[0-9]*|[.][0-9]+)" $text }}
{{- $suffix := trimPrefix $number $text }}
{{- /* an exponent ("e3", "E-1"), not the suffixes E (exa) and Ei */}}
{{- if regexMatch "^[eE][-+]?[0-9.]" $suffix }}
{{- $exp := int (trimPrefix "+" (substr 1 -1 $suffix)) }}
{{- $scale := 1000.0 }}
{{- range until (int (ternary $exp (sub 0 $exp) (gt $exp 0))) }}
{{- $scale = ternary (mulf $scale 10) (divf $scale 10) (gt $exp 0) }}
{{- end }}
{{- mulf (float64 $number) $scale }}
{{- else }}
{{- mulf (float64 $number) (get $suffixes $suffix) }}
{{- end }}
{{- end }}

{{/*
A quantity times a whole number, in the quantity's own notation and exact (decimal digits, no
floats): include "ddp-trainer.scaleQuantity" (list "1.5Gi" 8) is "12Gi", (list "500m" 3) "1500m".
*/}}
{{- define "ddp-trainer.scaleQuantity" -}}
{{- $text := toString (index . 0) }}
{{- $n := int (index . 1) }}
{{- $number := regexFind "^[+]?([0-9]+[.]?[0-9]*|[.][0-9]+)" $text }}
{{- $suffix := trimPrefix $number $text }}
{{- $parts := splitList "." (trimPrefix "+" $number) }}
{{- $fraction := "" }}
{{- if gt (len $parts) 1 }}
{{- $fraction = index $parts 1 }}
{{- end }}
{{- /* leading zeros stripped: sprig reads "010" as octal */}}
{{- $digits := regexReplaceAll "^0+" (printf "%s%s" (index $parts 0) $fraction) "" | default "0" }}
{{- $product := mul (int64 $digits) $n | toString }}
{{- $pad := sub (add (len $fraction) 1) (len $product) }}
{{- if gt $pad 0 }}
{{- $product = print (repeat (int $pad) "0") $product }}
{{- end }}
{{- $whole := substr 0 (sub (len $product) (len $fraction) | int) $product }}
{{- $decimals := regexReplaceAll "0+$" (substr (sub (len $product) (len $fraction) | int) -1 $product) "" }}
{{- $whole }}{{ with $decimals }}.{{ . }}{{ end }}{{ $suffix }}
{{- end }}

{{/*
Kubernetes' rules for a container's requests and limits (ValidateResourceRequirements), which
it applies only when the operator creates the pods: the job would sit with no pods and the
refusal only in an event. A name is a standard one or qualified by a domain. cpu, memory and ephemeral-storage may request less than their limit;
every other resource (GPUs, RDMA devices, hugepages) needs a limit equal to its request.
*/}}
{{- define "ddp-trainer.validateResources" -}}
{{- $resources := fromYaml (include "ddp-trainer.resources" .) }}
{{- $requests := dig "requests" dict $resources }}
{{- $limits := dig "limits" dict $resources }}
{{- $explicit := default dict .Values.resources.requests }}
{{- $ranks := include "ddp-trainer.nprocPerNode" . | int }}
{{- range $kind := list "requests" "limits" }}
{{- range $name, $_ := dig $kind dict $resources }}
{{- if not (regexMatch "^(cpu|memory|ephemeral-storage|hugepages-[^/]+|[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$" $name) }}
{{- fail (printf "resources.%s.%s: Kubernetes takes cpu, memory, ephemeral-storage, hugepages-<size> or a name qualified by a domain (e.g. nvidia.com/gpu); fix the name" $kind $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $name, $request := $requests }}
{{- $shown := $request }}
{{- if not (hasKey $explicit $name) }}
{{- $shown = printf "%v: resources.perGpu.requests.%s x %d" $request $name $ranks }}
{{- end }}
{{- $overcommit := has $name (list "cpu" "memory" "ephemeral-storage") }}
{{- if hasKey $limits $name }}
{{- $r := include "ddp-trainer.milli" $request | float64 }}
{{- $l := include "ddp-trainer.milli" (get $limits $name) | float64 }}
{{- if and $overcommit (gt $r $l) }}
{{- fail (printf "resources.requests.%s (%v) is above resources.limits.%s (%v): Kubernetes refuses the pods; lower the request or raise the limit" $name $shown $name (get $limits $name)) }}
{{- else if and (not $overcommit) (ne $r $l) }}
{{- fail (printf "resources.requests.%s (%v) must equal its limit (%v): Kubernetes does not overcommit %s; set both to the same count, or leave the request out (it defaults to the limit)" $name $shown (get $limits $name) $name) }}
{{- end }}
{{- else if not $overcommit }}
{{- fail (printf "resources.requests.%s needs an equal limit: Kubernetes does not overcommit %s; set resources.limits.%s (or gpusPerReplica for GPUs) to the same count" $name $name $name) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Kubernetes' cross-field rules for a toleration (ValidateTolerations), which it applies only when
the operator creates the pods. The schema checks each field's type and values.
*/}}
{{- define "ddp-trainer.validateTolerations" -}}
{{- range $i, $t := .Values.tolerations }}
{{- $operator := default "Equal" $t.operator }}
{{- if and (not $t.key) (ne $operator "Exists") }}
{{- fail (printf "tolerations[%d]: without a key a toleration matches every taint, which needs operator: Exists; set a key or operator: Exists" $i) }}
{{- end }}
{{- if and (eq $operator "Exists") $t.value }}
{{- fail (printf "tolerations[%d]: operator Exists takes no value (%q); remove the value or use operator: Equal" $i $t.value) }}
{{- end }}
{{- if and (hasKey $t "tolerationSeconds") (ne (default "" $t.effect) "NoExecute") }}
{{- fail (printf "tolerations[%d]: tolerationSeconds applies only to effect NoExecute; set effect: NoExecute or remove tolerationSeconds" $i) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Checks the schema cannot express: cross-field rules of the training operator's admission webhook
and of Kubernetes' pod validation, and under apiKind TrainJob every value that Trainer v2 cannot
express (never dropped silently).
*/}}
{{- define "ddp-trainer.validate" -}}
{{- if include "ddp-trainer.isTrainJob" . }}
{{- include "ddp-trainer.validateTrainJob" . }}
{{- end }}
{{- include "ddp-trainer.validateResources" . }}
{{- include "ddp-trainer.validateTolerations" . }}
{{- if and (not (include "ddp-trainer.isTrainJob" .)) (eq (int .Values.masterPort) (int .Values.metrics.port)) }}
{{- fail (printf "masterPort and metrics.port are both %d: the Master's rendezvous and the metrics endpoint cannot listen on one port; pick another for either" (int .Values.masterPort)) }}
{{- end }}
{{- if and .Values.elastic.enabled (lt (int .Values.worker.replicas) 1) }}
{{- fail "elastic.enabled: an elastic PyTorchJob needs a Worker replica spec; set worker.replicas to 1 or more" }}
{{- end }}
{{- if .Values.elastic.enabled }}
{{- $nodes := add 1 (int .Values.worker.replicas) }}
{{- $min := int (default $nodes .Values.elastic.minNodes) }}
{{- $max := int (default $nodes .Values.elastic.maxNodes) }}
{{- if gt $min $max }}
{{- fail (printf "elastic.minNodes (%d) must not exceed elastic.maxNodes (%d)" $min $max) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Kubeflow Trainer v2 mode (apiKind: TrainJob): "true" or "".
*/}}
{{- define "ddp-trainer.isTrainJob" -}}
{{- if eq .Values.apiKind "TrainJob" }}true{{ end }}
{{- end }}

{{/*
The training container's name: the training operator requires `pytorch`; Trainer v2's torch
plugin finds the trainer container by the name `node` (kubeflow/trainer v2.3.0
pkg/constants/constants.go:68-69, pkg/runtime/framework/plugins/torch/torch.go:140).
*/}}
{{- define "ddp-trainer.containerName" -}}
{{- if include "ddp-trainer.isTrainJob" . }}node{{ else }}pytorch{{ end }}
{{- end }}

{{/*
apiKind TrainJob: fail on values Kubeflow Trainer v2.3 cannot express, naming the value and the fix.
*/}}
{{- define "ddp-trainer.validateTrainJob" -}}
{{- $v := .Values }}
{{- $fix := "use apiKind=PyTorchJob, or leave it at its default" }}
{{- if $v.elastic.enabled }}
{{- fail (printf "elastic.enabled: Kubeflow Trainer v2 has no elastic PyTorch training (a TrainJob has no elasticPolicy); %s" $fix) }}
{{- end }}
{{- if $v.scheduling.volcano.enabled }}
{{- fail (printf "scheduling.volcano.enabled: under Trainer v2 gang scheduling is the runtime's podGroupPolicy, not the job's; set it in your (Cluster)TrainingRuntime, or %s" $fix) }}
{{- end }}
{{- if ne (int $v.masterPort) 23456 }}
{{- fail (printf "masterPort: Trainer v2 always rendezvouses on port 29500 (PET_MASTER_PORT); %s" $fix) }}
{{- end }}
{{- if eq (int $v.metrics.port) 29500 }}
{{- fail "metrics.port: 29500 is Trainer v2's rendezvous port (PET_MASTER_PORT); pick another metrics port" }}
{{- end }}
{{- if ne $v.runPolicy.cleanPodPolicy "Running" }}
{{- fail (printf "runPolicy.cleanPodPolicy: a TrainJob has no cleanPodPolicy; %s" $fix) }}
{{- end }}
{{- if not (kindIs "invalid" $v.runPolicy.ttlSecondsAfterFinished) }}
{{- fail (printf "runPolicy.ttlSecondsAfterFinished: a TrainJob has no TTL (it stays until deleted); %s" $fix) }}
{{- end }}
{{- if eq $v.restartPolicy "ExitCode" }}
{{- fail "restartPolicy: ExitCode is a training-operator policy; a TrainJob's pods (batch Jobs) take OnFailure or Never" }}
{{- end }}
{{- range $v.env }}
{{- if has .name (list "PET_NNODES" "PET_NPROC_PER_NODE" "PET_NODE_RANK" "PET_MASTER_ADDR" "PET_MASTER_PORT") }}
{{- fail (printf "env: %s is set by the Trainer v2 controller, which rejects a TrainJob that sets it; remove it from env" .name) }}
{{- end }}
{{- end }}
{{- if $v.trainJob.createRuntime }}
{{- if or (ne $v.trainJob.runtimeRef.kind "ClusterTrainingRuntime") (ne $v.trainJob.runtimeRef.name "torch-distributed") }}
{{- fail "trainJob.runtimeRef: with trainJob.createRuntime=true the TrainJob references the chart's own TrainingRuntime; leave trainJob.runtimeRef at its default" }}
{{- end }}
{{- else }}
{{- $patchFix := "a TrainJob's runtimePatches cannot set it, so the referenced runtime decides; set trainJob.createRuntime=true (the chart renders a TrainingRuntime with it) or leave it at its default" }}
{{- range $key := list "priorityClassName" "runtimeClassName" "schedulerName" }}
{{- if index $v $key }}
{{- fail (printf "%s: %s" $key $patchFix) }}
{{- end }}
{{- end }}
{{- if $v.envFrom }}
{{- fail (printf "envFrom: %s" $patchFix) }}
{{- end }}
{{- if ne $v.image.pullPolicy "IfNotPresent" }}
{{- fail (printf "image.pullPolicy: %s" $patchFix) }}
{{- end }}
{{- if ne $v.restartPolicy "OnFailure" }}
{{- fail (printf "restartPolicy: %s (JobSet defaults it to OnFailure)" $patchFix) }}
{{- end }}
{{- if ne (int $v.runPolicy.backoffLimit) 3 }}
{{- fail (printf "runPolicy.backoffLimit: %s" $patchFix) }}
{{- end }}
{{- if and (not $v.serviceAccount.create) (not $v.serviceAccount.automountServiceAccountToken) }}
{{- fail (printf "serviceAccount.automountServiceAccountToken: with serviceAccount.create=false the existing ServiceAccount's setting applies; %s, or set it to true to accept that" $patchFix) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The hang watchdog posts its verdict as a Warning Event on the job: "true" or "" (needs the
chart's own ServiceAccount, whose Role allows exactly that: templates/rbac.yaml).
*/}}
{{- define "ddp-trainer.hangEvents" -}}
{{- if and .Values.serviceAccount.create .Values.serviceAccount.hangEvents }}true{{ end }}
{{- end }}
