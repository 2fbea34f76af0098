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

{{- /* "true" where the cluster serves ValidatingAdmissionPolicy v1 (Kubernetes >= 1.30), which
     the guardrails are made of; empty on 1.28 and 1.29 (the chart's kubeVersion). */}}
{{- define "rlkube.admissionPolicies" -}}
{{- if or (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")
          (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) -}}
true
{{- end -}}
{{- end -}}

{{- /* The guardrails' values the operator (--guardrails) and the admission policy enforce, as JSON:
     `guardrails` but `enabled`, with `<image.registry>/` among the allowed image registries and
     the operator's token key among the Secrets no run may name, whatever the lists allow. */}}
{{- define "rlkube.guardrails" -}}
{{- $g := omit .Values.guardrails "enabled" }}
{{- $registries := prepend $g.allowedImageRegistries (printf "%s/" .Values.image.registry) | uniq }}
{{- $key := .Values.tokenKey.existingSecret | default (printf "%s-token-key" (include "rlkube.fullname" .)) }}
{{- $protected := append ($g.protectedSecrets | default list) $key }}
{{- if .Values.tokenKey.previousSecret }}{{ $protected = append $protected .Values.tokenKey.previousSecret }}{{ end }}
{{- $_ := set $g "protectedSecrets" ($protected | uniq) }}
{{- set $g "allowedImageRegistries" $registries | toJson }}
{{- end -}}

{{- define "rlkube.operatorImage" -}}
{{- $repository := .Values.image.repository | default (printf "%s/rlkube-operator" .Values.image.registry) }}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end -}}

{{/* The namespaces watched in single-namespace mode. */}}
{{- define "rlkube.namespaces" -}}
{{- if .Values.watch.namespaces -}}
{{- join "," .Values.watch.namespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{- /* The NetworkPolicyPeer of the metrics scraper (networkPolicy.metricsScraper), as JSON; empty
     when no namespace is named: a scraper is admitted by its namespace, never by pod labels alone. */}}
{{- define "rlkube.scraperPeer" -}}
{{- with .Values.networkPolicy.metricsScraper }}
{{- if .namespaces }}
{{- $peer := dict "namespaceSelector" (dict "matchExpressions" (list (dict "key" "kubernetes.io/metadata.name" "operator" "In" "values" .namespaces))) }}
{{- if .podSelector }}{{ $_ := set $peer "podSelector" .podSelector }}{{ end }}
{{- $peer | toJson }}
{{- end }}
{{- end }}
{{- end -}}

