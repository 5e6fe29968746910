{{- define "clarion.name" -}}{{ .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end }}

{{- define "clarion.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end }}

{{- define "clarion.selectorLabels" -}}
app.kubernetes.io/name: {{ include "clarion.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "clarion.labels" -}}
{{ include "clarion.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "clarion.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "clarion.fullname" .) .Values.serviceAccount.name }}
{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end }}

{{- define "clarion.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}{{ .Values.image.repository }}:{{ $tag }}{{- end -}}
{{- end }}

{{/* preStop sleep + drain_period + shutdown_timeout + margin: the time a pod needs to tell
every client to go before the kubelet's SIGKILL. */}}
{{- define "clarion.gracePeriod" -}}
{{- $d := .Values.drain -}}
{{- $need := add $d.preStopSleepSeconds $d.drainPeriodSeconds $d.shutdownTimeoutSeconds $d.graceMarginSeconds -}}
{{- if $d.terminationGracePeriodSeconds -}}
{{- if lt (int $d.terminationGracePeriodSeconds) (int $need) -}}
{{- fail (printf "drain.terminationGracePeriodSeconds (%v) is below preStop + drain + shutdown + margin (%v): the kubelet would kill pods mid-drain" $d.terminationGracePeriodSeconds $need) -}}
{{- end -}}
{{- $d.terminationGracePeriodSeconds -}}
{{- else -}}{{ $need }}{{- end -}}
{{- end }}

{{/* The broker URL, with $(REDIS_PASSWORD) expanded by the kubelet from the Secret. */}}
{{- define "clarion.brokerURL" -}}
{{- $b := .Values.broker -}}
{{- $auth := ternary ":$(REDIS_PASSWORD)@" "" (ne $b.passwordSecret.name "") -}}
{{- $s := ternary "s" "" $b.tls -}}
{{- if eq $b.mode "redis" -}}redis{{ $s }}://{{ $auth }}{{ first $b.hosts }}
{{- else if eq $b.mode "sentinel" -}}redis{{ $s }}+sentinel://{{ $auth }}{{ join "," $b.hosts }}/{{ $b.masterName }}
{{- else if eq $b.mode "cluster" -}}redis{{ $s }}+cluster://{{ $auth }}{{ join "," $b.hosts }}
{{- end -}}
{{- end }}

{{- define "clarion.secretName" -}}{{ include "clarion.fullname" . }}-secrets{{- end }}
