{{/*
Pod template of one replica type: include "ddp-trainer.podTemplate" (dict "root" $ "replicaType" "master")
*/}}
{{- define "ddp-trainer.podTemplate" -}}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- $gpus := int $v.gpusPerReplica -}}
metadata:
  labels:
    {{- include "ddp-trainer.selectorLabels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .replicaType }}
    app.kubernetes.io/part-of: ddp-trainer
    {{- with $v.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    kubectl.kubernetes.io/default-container: pytorch
    {{- if $v.metrics.scrapeAnnotations }}
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ $v.metrics.port | quote }}
    prometheus.io/path: /metrics
    {{- end }}
    {{- with $v.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
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
  {{- with $v.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $tolerations := list }}
  {{- if and $v.gpuToleration (gt $gpus 0) }}
  {{- $tolerations = append $tolerations (dict "key" $v.gpuResourceName "operator" "Exists" "effect" "NoSchedule") }}
  {{- end }}
  {{- $tolerations = concat $tolerations $v.tolerations }}
  {{- with $tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: pytorch
      image: {{ include "ddp-trainer.image" $root | quote }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      command: ["ddp-trainer"]
      args:
        {{- if include "ddp-trainer.useLauncher" $root }}
        - run
        - --nproc-per-node
        - {{ include "ddp-trainer.nprocPerNode" $root | quote }}
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
      ports:
        - name: pytorchjob-port
          containerPort: {{ $v.masterPort }}
          protocol: TCP
        - name: metrics
          containerPort: {{ $v.metrics.port }}
          protocol: TCP
      env:
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
        {{- with $v.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $v.envFrom }}
      envFrom:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      resources:
        {{- $requests := deepCopy (default dict $v.resources.requests) }}
        {{- $limits := deepCopy (default dict $v.resources.limits) }}
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
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- with $limits }}
        limits:
          {{- toYaml . | nindent 10 }}
        {{- end }}
      {{- $sc := deepCopy (default dict $v.securityContext) }}
      {{- if $v.rdma.enabled }}
      {{- $caps := deepCopy (default dict $sc.capabilities) }}
      {{- $_ := set $caps "add" (uniq (concat (default list $caps.add) (list "IPC_LOCK"))) }}
      {{- $_ = set $sc "capabilities" $caps }}
      {{- end }}
      {{- with $sc }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        - name: config
          mountPath: /etc/ddp-trainer
          readOnly: true
        - name: dshm
          mountPath: /dev/shm
        - name: tmp
          mountPath: /tmp
        {{- if include "ddp-trainer.claimName" (list $root "data") }}
        - name: data
          mountPath: /data
          readOnly: {{ $v.persistence.data.readOnly }}
        {{- end }}
        - name: checkpoints
          mountPath: /checkpoints
        - name: outputs
          mountPath: /outputs
        {{- with $v.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "ddp-trainer.fullname" $root }}-config
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $v.shm.sizeLimit }}
    - name: tmp
      emptyDir:
        sizeLimit: {{ $v.tmp.sizeLimit }}
    {{- with include "ddp-trainer.claimName" (list $root "data") }}
    - name: data
      persistentVolumeClaim:
        claimName: {{ . }}
        readOnly: {{ $v.persistence.data.readOnly }}
    {{- end }}
    {{- range $key := list "checkpoints" "outputs" }}
    - name: {{ $key }}
      {{- with include "ddp-trainer.claimName" (list $root $key) }}
      persistentVolumeClaim:
        claimName: {{ . }}
      {{- else }}
      emptyDir:
        sizeLimit: {{ (index $v.persistence $key).emptyDirSizeLimit }}
      {{- end }}
    {{- end }}
    {{- with $v.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}
