{{- define "flotilla.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "flotilla.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "flotilla.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "flotilla.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "flotilla.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flotilla.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "flotilla.labels" -}}
{{ include "flotilla.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: autoscaler
app.kubernetes.io/part-of: flotilla
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "flotilla.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "flotilla.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "flotilla.configMapName" -}}
{{- default (include "flotilla.fullname" .) .Values.config.existingConfigMap -}}
{{- end -}}

{{- define "flotilla.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The rendered config.toml: directories and [server] from values, then config.pools. */}}
{{- define "flotilla.config" -}}
# Written by the flotilla chart: the directories and [server] come from its values.
cache_dir = "/var/cache/flotilla"
state_dir = "/var/lib/flotilla"

[server]
listen = "0.0.0.0:{{ .Values.server.port }}"
metrics_listen = "0.0.0.0:{{ .Values.server.metricsPort }}"
token = { file = "/etc/flotilla/secrets/api-token/{{ .Values.apiToken.key }}" }
{{- if .Values.machineDiscovery.existingSecret }}
sd_token = { file = "/etc/flotilla/secrets/sd-token/{{ .Values.machineDiscovery.key }}" }
{{- end }}
shutdown_grace = "{{ .Values.server.shutdownGraceSeconds }}s"
{{- range $i, $o := .Values.operators }}

[[server.operator]]
name = {{ $o.name | quote }}
token = { file = "/etc/flotilla/secrets/operators/{{ $i }}/{{ $o.key | default "token" }}" }
{{- end }}

{{ .Values.config.pools }}
{{- end -}}

{{/*
terminationGracePeriodSeconds: the preStop sleep, then shutdown_grace for leases to be
released, then up to 15 s for each pool's plugin shutdown (PLUGIN_SHUTDOWN_ALLOWANCE in
host/flotilla/src/app.rs), plus 5 s to exit.
*/}}
{{- define "flotilla.terminationGracePeriodSeconds" -}}
{{- add .Values.preStopSleepSeconds .Values.server.shutdownGraceSeconds 15 5 -}}
{{- end -}}
