{{/* Name of the operator's objects. */}}
{{- define "rlkube.fullname" -}}
{{- printf "%s-rlkube-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rlkube.serviceAccountName" -}}
{{- default (include "rlkube.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "rlkube.selectorLabels" -}}
app.kubernetes.io/name: rlkube-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rlkube.labels" -}}
{{ include "rlkube.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The namespaces watched in single-namespace mode. */}}
{{- define "rlkube.namespaces" -}}
{{- if .Values.watch.namespaces -}}
{{- join "," .Values.watch.namespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}
