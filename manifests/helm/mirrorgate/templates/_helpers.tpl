{{/* The label every object carries; also the Pods' selector. */}}
{{- define "mirrorgate.selectorLabels" -}}
app.kubernetes.io/name: mirrorgate
{{- end }}

{{/* Object labels: the selector label and Helm's own bookkeeping. */}}
{{- define "mirrorgate.labels" -}}
{{ include "mirrorgate.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "mirrorgate.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}:{{ $tag }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end }}

{{/* Namespaces the API server never sends to mirrorgate, whatever their labels:
the control plane and mirrorgate's own (a webhook intercepting its own Pods can
deadlock a cluster), then the user's. */}}
{{- define "mirrorgate.excludedNamespaces" -}}
{{- concat (list "kube-system" .Release.Namespace) .Values.excludedNamespaces | uniq | toJson -}}
{{- end }}

{{/* Labels of the monitoring objects: the usual ones, and those Prometheus
and Grafana select by (monitoring.labels, e.g. release: prometheus). */}}
{{- define "mirrorgate.monitoringLabels" -}}
{{ include "mirrorgate.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}
