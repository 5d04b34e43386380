{{/*
The pod of one node, in pieces: the PyTorchJob's replica templates use them all (podTemplate);
a TrainJob (trainjob.yaml) puts the container's image, command, env and resources into
spec.trainer and the rest into a runtime patch, or into the TrainingRuntime the chart renders.
*/}}

{{/*
Pod labels: the chart's selector labels (PodMonitor, NetworkPolicy) and podLabels.
include "ddp-trainer.podLabels" (dict "root" $ "component" "master")
*/}}
{{- define "ddp-trainer.podLabels" -}}
{{ include "ddp-trainer.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: ddp-trainer
{{- with .root.Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "ddp-trainer.podAnnotations" -}}
{{- $v := .Values -}}
kubectl.kubernetes.io/default-container: {{ include "ddp-trainer.containerName" . }}
{{- if $v.metrics.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ $v.metrics.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with $v.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Tolerations (a YAML list; empty when there are none).
*/}}
{{- define "ddp-trainer.tolerations" -}}
{{- $v := .Values }}
{{- $tolerations := list }}
{{- if and $v.gpuToleration (gt (int $v.gpusPerReplica) 0) }}
{{- $tolerations = append $tolerations (dict "key" $v.gpuResourceName "operator" "Exists" "effect" "NoSchedule") }}
{{- end }}
{{- if not (kindIs "invalid" $v.nodeLossToleranceSeconds) }}
{{- range list "node.kubernetes.io/not-ready" "node.kubernetes.io/unreachable" }}
{{- $tolerations = append $tolerations (dict "key" . "operator" "Exists" "effect" "NoExecute" "tolerationSeconds" (int $v.nodeLossToleranceSeconds)) }}
{{- end }}
{{- end }}
{{- $tolerations = concat $tolerations $v.tolerations }}
{{- with $tolerations }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
Affinity: the `affinity` value and, with spreadAcrossNodes, a podAntiAffinity term on
kubernetes.io/hostname over this release's pods (YAML; empty when there is none). Anti-affinity
rather than topologySpreadConstraints: a TrainJob's runtime patch has no field for the latter.
*/}}
{{- define "ddp-trainer.affinity" -}}
{{- $v := .Values }}
{{- $affinity := deepCopy $v.affinity }}
{{- with $v.spreadAcrossNodes }}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "ddp-trainer.selectorLabels" $ | fromYaml)) }}
{{- $anti := deepCopy (get $affinity "podAntiAffinity" | default dict) }}
{{- if eq . "required" }}
{{- $_ := set $anti "requiredDuringSchedulingIgnoredDuringExecution" (append (get $anti "requiredDuringSchedulingIgnoredDuringExecution" | default list) $term) }}
{{- else }}
{{- $_ := set $anti "preferredDuringSchedulingIgnoredDuringExecution" (append (get $anti "preferredDuringSchedulingIgnoredDuringExecution" | default list) (dict "weight" 100 "podAffinityTerm" $term)) }}
{{- end }}
{{- $_ := set $affinity "podAntiAffinity" $anti }}
{{- end }}
{{- with $affinity }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{/*
The trainer command's arguments. Under Trainer v2 the controller runs no launcher and sets only
torchrun's PET_* variables, so every node runs `ddp-trainer run` (kubeflow/trainer v2.3.0
pkg/runtime/framework/plugins/torch/torch.go:145-166).
*/}}
{{- define "ddp-trainer.args" -}}
{{- $v := .Values }}
{{- if or (include "ddp-trainer.useLauncher" .) (include "ddp-trainer.isTrainJob" .) }}
- run
- --nproc-per-node
- {{ include "ddp-trainer.nprocPerNode" . | quote }}
{{- if $v.elastic.enabled }}
- --max-restarts
- {{ $v.elastic.maxRestarts | quote }}
{{- end }}
{{- else }}
- train
{{- end }}
- --config
- /etc/ddp-trainer/config.yaml
{{- range $v.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/*
The container's environment. Its CPU limit and request, in millicores, size each rank's
threads (trainer/distributed/threads.py); passed only when set, as the downward API reports
the node's allocatable CPU for a missing limit.
*/}}
{{- define "ddp-trainer.env" -}}
{{- $resources := include "ddp-trainer.resources" . | fromYaml -}}
- name: HOME
  value: /tmp
- name: XDG_CACHE_HOME
  value: /tmp/.cache
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
{{- if include "ddp-trainer.hangEvents" . }}
# The hang watchdog's Warning Event on the job (trainer/distributed/hang_event.py): the job's
# kind, its name from the operator's pod label, and the projected token of `api-token`.
- name: DDP_TRAINER_JOB_KIND
  value: {{ .Values.apiKind }}
- name: DDP_TRAINER_JOB_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.labels['{{ if include "ddp-trainer.isTrainJob" . }}jobset.sigs.k8s.io/jobset-name{{ else }}training.kubeflow.org/job-name{{ end }}']
- name: DDP_TRAINER_API_ACCOUNT
  value: /var/run/secrets/ddp-trainer
{{- with .Values.scheduling.kueue.queueName }}
# Rank 0 reads its Kueue Workload once at start: time queued and evictions, exported as
# metrics (trainer/distributed/queue_report.py).
- name: DDP_TRAINER_QUEUE
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- range $kind, $name := dict "limits" "DDP_TRAINER_CPU_LIMIT_MILLICORES" "requests" "DDP_TRAINER_CPU_REQUEST_MILLICORES" }}
{{- if dig $kind "cpu" "" $resources }}
- name: {{ $name }}
  valueFrom:
    resourceFieldRef:
      resource: {{ $kind }}.cpu
      divisor: 1m
{{- end }}
{{- end }}
{{- with .Values.storage.s3 }}
{{- if .bucket }}
{{- if .endpoint }}
- name: AWS_ENDPOINT_URL
  value: {{ .endpoint | quote }}
{{- end }}
{{- if .region }}
- name: AWS_DEFAULT_REGION
  value: {{ .region | quote }}
{{- end }}
{{- if .secretName }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .secretAccessKeyKey }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.env }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Container resources: CPU/memory from resources.perGpu times the ranks of the pod (a CPU pod runs
one), key by key overridden by resources.requests/limits; GPUs from gpusPerReplica; RDMA devices.
*/}}
{{- define "ddp-trainer.resources" -}}
{{- $v := .Values }}
{{- $gpus := int $v.gpusPerReplica }}
{{- $ranks := include "ddp-trainer.nprocPerNode" . | int }}
{{- $perGpu := default dict $v.resources.perGpu }}
{{- $requests := dict }}
{{- $limits := dict }}
{{- range $name, $q := default dict $perGpu.requests }}
{{- $_ := set $requests $name (include "ddp-trainer.scaleQuantity" (list $q $ranks)) }}
{{- end }}
{{- range $name, $q := default dict $perGpu.limits }}
{{- $_ := set $limits $name (include "ddp-trainer.scaleQuantity" (list $q $ranks)) }}
{{- end }}
{{- $requests = merge (deepCopy (default dict $v.resources.requests)) $requests }}
{{- $limits = merge (deepCopy (default dict $v.resources.limits)) $limits }}
{{- if gt $gpus 0 }}
{{- $_ := set $limits $v.gpuResourceName $gpus }}
{{- end }}
{{- if $v.rdma.enabled }}
{{- range $name, $count := $v.rdma.resources }}
{{- $_ := set $limits $name $count }}
{{- end }}
{{- end }}
{{- with $requests }}
requests:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $limits }}
limits:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Size limit of /dev/shm: shm.sizeLimit, else shm.perGpu times the ranks of the pod.
*/}}
{{- define "ddp-trainer.shmSizeLimit" -}}
{{- .Values.shm.sizeLimit | default (include "ddp-trainer.scaleQuantity" (list .Values.shm.perGpu (include "ddp-trainer.nprocPerNode" . | int))) }}
{{- end }}

{{- define "ddp-trainer.securityContext" -}}
{{- $v := .Values }}
{{- $sc := deepCopy (default dict $v.securityContext) }}
{{- if $v.rdma.enabled }}
{{- $caps := deepCopy (default dict $sc.capabilities) }}
{{- $_ := set $caps "add" (uniq (concat (default list $caps.add) (list "IPC_LOCK"))) }}
{{- $_ = set $sc "capabilities" $caps }}
{{- end }}
{{- with $sc }}
{{- toYaml . }}
{{- end }}
{{- end }}

{{- define "ddp-trainer.volumeMounts" -}}
{{- $v := .Values -}}
- name: config
  mountPath: /etc/ddp-trainer
  readOnly: true
- name: dshm
  mountPath: /dev/shm
- name: tmp
  mountPath: /tmp
{{- if include "ddp-trainer.claimName" (list . "data") }}
- name: data
  mountPath: /data
  readOnly: {{ $v.persistence.data.readOnly }}
{{- end }}
{{- if not .Values.storage.s3.bucket }}
- name: checkpoints
  mountPath: /checkpoints
- name: outputs
  mountPath: /outputs
{{- end }}
{{- if include "ddp-trainer.hangEvents" . }}
- name: api-token
  mountPath: /var/run/secrets/ddp-trainer
  readOnly: true
{{- end }}
{{- with $v.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "ddp-trainer.volumes" -}}
{{- $root := . }}
{{- $v := .Values -}}
- name: config
  configMap:
    name: {{ include "ddp-trainer.fullname" $root }}-config
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ include "ddp-trainer.shmSizeLimit" $root }}
- name: tmp
  emptyDir:
    sizeLimit: {{ $v.tmp.sizeLimit }}
{{- with include "ddp-trainer.claimName" (list $root "data") }}
- name: data
  persistentVolumeClaim:
    claimName: {{ . }}
    readOnly: {{ $v.persistence.data.readOnly }}
{{- end }}
{{- range $key := ternary (list) (list "checkpoints" "outputs") (ne $v.storage.s3.bucket "") }}
- name: {{ $key }}
  {{- with include "ddp-trainer.claimName" (list $root $key) }}
  persistentVolumeClaim:
    claimName: {{ . }}
  {{- else }}
  emptyDir:
    sizeLimit: {{ (index $v.persistence $key).emptyDirSizeLimit }}
  {{- end }}
{{- end }}
{{- if include "ddp-trainer.hangEvents" $root }}
# Only this token, not the automounted one (automountServiceAccountToken stays false): an
# hour-long token of the job's ServiceAccount, rotated by the kubelet, and the cluster's CA.
- name: api-token
  projected:
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3600
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
{{- end }}
{{- with $v.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The whole pod template of one node: include "ddp-trainer.podTemplate" (dict "root" $ "replicaType" "master")
A PyTorchJob replica (container `pytorch`, port `pytorchjob-port`) or, under Trainer v2, the
`node` pod of the chart's TrainingRuntime (container `node`; the controller adds port 29500).
*/}}
{{- define "ddp-trainer.podTemplate" -}}
{{- $root := .root }}
{{- $v := $root.Values -}}
metadata:
  labels:
    {{- include "ddp-trainer.podLabels" (dict "root" $root "component" .replicaType) | nindent 4 }}
  annotations:
    {{- include "ddp-trainer.podAnnotations" $root | nindent 4 }}
spec:
  {{- if include "ddp-trainer.isTrainJob" $root }}
  restartPolicy: {{ $v.restartPolicy }}
  {{- end }}
  serviceAccountName: {{ include "ddp-trainer.serviceAccountName" $root }}
  automountServiceAccountToken: {{ $v.serviceAccount.automountServiceAccountToken }}
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
  {{- with $v.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $v.runtimeClassName }}
  runtimeClassName: {{ . }}
  {{- end }}
  {{- with $v.schedulerName }}
  schedulerName: {{ . }}
  {{- end }}
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.podSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (include "ddp-trainer.affinity" $root | trim) }}
  affinity:
    {{- . | nindent 4 }}
  {{- end }}
  {{- with (include "ddp-trainer.tolerations" $root | trim) }}
  tolerations:
    {{- . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ include "ddp-trainer.containerName" $root }}
      image: {{ include "ddp-trainer.image" $root | quote }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      # The trainer writes its one-line error to /dev/termination-log (kubectl describe pod,
      # ddp-trainer jobs status); a container killed before it could (OOM, SIGKILL) shows the
      # tail of its log instead.
      terminationMessagePolicy: FallbackToLogsOnError
      command: ["ddp-trainer"]
      args:
        {{- include "ddp-trainer.args" $root | trim | nindent 8 }}
      ports:
        {{- if not (include "ddp-trainer.isTrainJob" $root) }}
        - name: pytorchjob-port
          containerPort: {{ $v.masterPort }}
          protocol: TCP
        {{- end }}
        - name: metrics
          containerPort: {{ $v.metrics.port }}
          protocol: TCP
      env:
        {{- include "ddp-trainer.env" $root | nindent 8 }}
      {{- with $v.envFrom }}
      envFrom:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with (include "ddp-trainer.resources" $root | trim) }}
      resources:
        {{- . | nindent 8 }}
      {{- end }}
      {{- with (include "ddp-trainer.securityContext" $root | trim) }}
      securityContext:
        {{- . | nindent 8 }}
      {{- end }}
      volumeMounts:
        {{- include "ddp-trainer.volumeMounts" $root | nindent 8 }}
  volumes:
    {{- include "ddp-trainer.volumes" $root | nindent 4 }}
{{- end }}
