{{- define "slurm-bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "slurm-bridge.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "slurm-bridge.labels" -}}
app.kubernetes.io/name: {{ include "slurm-bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: slinky
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "slurm-bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "slurm-bridge.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "slurm-bridge.webhookService" -}}
{{- printf "%s-webhook" (include "slurm-bridge.fullname" .) }}
{{- end }}

{{- /* The config file: upstream's keys from sharedConfig, plus where the credentials are. */ -}}
{{- define "slurm-bridge.config" -}}
{{- $c := .root.Values.sharedConfig }}
{{- $a := .root.Values.slurmAuth }}
{{- $cfg := dict
      "schedulerName" $c.schedulerName
      "slurmRestApi" $c.slurmRestApi
      "managedNamespaces" $c.managedNamespaces
      "mcsLabel" $c.mcsLabel
      "partition" $c.partition
      "managedNodeTaint" $c.managedNodeTaint
      "nodeHealth" $c.nodeHealth
      "slurmPollInterval" $c.slurmPollInterval
      "slurmIdlePollInterval" $c.slurmIdlePollInterval
      "immediateAllocation" $c.immediateAllocation }}
{{- with $c.managedNamespaceSelector }}
{{- $_ := set $cfg "managedNamespaceSelector" . }}
{{- end }}
{{- with $c.clusterId }}
{{- $_ := set $cfg "clusterId" . }}
{{- end }}
{{- with $c.policy }}
{{- $_ := set $cfg "policy" . }}
{{- end }}
{{- if .admission }}
{{- /* The webhook never talks to Slurm: no credentials in its config (or its pod). */ -}}
{{- else if $a.jwtKeySecretRef.name }}
{{- $_ := set $cfg "slurmAuth" (dict "jwtKeyFile" (printf "/var/run/secrets/slurm/%s" $a.jwtKeySecretRef.key) "user" $a.user "tokenLifetime" $a.tokenLifetime) }}
{{- else if $a.tokenSecretRef.name }}
{{- $_ := set $cfg "slurmAuth" (dict "tokenFile" (printf "/var/run/secrets/slurm/%s" $a.tokenSecretRef.key) "user" $a.user) }}
{{- else }}
{{- fail "slurmAuth: set jwtKeySecretRef.name (the Slurm JWT key) or tokenSecretRef.name (a stored token)" }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{- /* namespaceSelector excluding kube-system and the bridge's own namespace. */ -}}
{{- define "slurm-bridge.excluded" -}}
key: kubernetes.io/metadata.name
operator: NotIn
values: {{ list "kube-system" .Release.Namespace | uniq | sortAlpha | toJson }}
{{- end }}
