{{/* The chart's name, nameOverride replacing it (the name label). */}}
{{- define "mirrorgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* The objects' name (and the stem of mirrorgate-tls, mirrorgate-policy, ...):
fullnameOverride, else the name. Unlike most charts the release name is no
prefix: one installation per cluster, whose defaults match the kustomize base. */}}
{{- define "mirrorgate.fullname" -}}
{{- default (include "mirrorgate.name" .) .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{- define "mirrorgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{ default (include "mirrorgate.fullname" .) .Values.serviceAccount.name }}
{{- else -}}
{{ required "serviceAccount.name: the ServiceAccount to run as when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end -}}
{{- end }}

{{/* The label every object carries; also the Pods' selector. */}}
{{- define "mirrorgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mirrorgate.name" . }}
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

{{/* The policy as given, its exclude.namespaces completed with the release
namespace (by its own name, wherever the chart is installed): mirrorgate
never rewrites its own Pods, even where the webhook's namespaceSelector is
not what decides (`mirrorgate audit`, a copied policy file). */}}
{{- define "mirrorgate.policy" -}}
{{- $policy := deepCopy .Values.policy -}}
{{- $exclude := $policy.exclude | default dict -}}
{{- $namespaces := $exclude.namespaces | default list -}}
{{- if not (has .Release.Namespace $namespaces) -}}
{{- $namespaces = append $namespaces .Release.Namespace -}}
{{- end -}}
{{- $_ := set $exclude "namespaces" $namespaces -}}
{{- $_ := set $policy "exclude" $exclude -}}
{{- toYaml $policy -}}
{{- end }}

{{- define "mirrorgate.providersImage" -}}
{{- with .Values.credentialProviders.image -}}
{{- if not .digest -}}
{{- fail "credentialProviders.image.digest: give the plugin image by digest (sha256:...), not by tag alone: the plugins run with the plugin host's cloud identity, and a tag can be moved to other binaries" -}}
{{- end -}}
{{ .repository }}{{ with .tag }}:{{ . }}{{ end }}@{{ .digest }}
{{- end -}}
{{- end }}

{{/* A value every chart version since it was added sets by default, missing:
what `helm upgrade --reuse-values` does, as it keeps the previous chart's
defaults, which lack the values added since (docs/upgrading.md). Takes (list
NAME VALUE); returns VALUE. */}}
{{- define "mirrorgate.defaulted" -}}
{{- $name := index . 0 -}}
{{- $value := index . 1 -}}
{{- if kindIs "invalid" $value -}}
{{- fail (printf "%s: no value: `helm upgrade --reuse-values` keeps the previous chart's defaults, which lack it; upgrade with --reset-then-reuse-values (docs/upgrading.md)" $name) -}}
{{- end -}}
{{- $value -}}
{{- end }}
