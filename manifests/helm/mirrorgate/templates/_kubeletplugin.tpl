{{/* Secretless pulls (kubeletPlugin): the names and the kubelet's configuration. */}}

{{- define "mirrorgate.kubeletPlugin.name" -}}
{{ include "mirrorgate.fullname" . | trunc 48 | trimSuffix "-" }}-kubelet-plugin
{{- end }}

{{/* The plugin's Pods: not the server's selector label, so that no Service of
mirrorgate's ever sends them a request. */}}
{{- define "mirrorgate.kubeletPlugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mirrorgate.name" . | trunc 48 | trimSuffix "-" }}-kubelet-plugin
app.kubernetes.io/part-of: {{ include "mirrorgate.name" . }}
{{- end }}

{{/* The mirrors (host and path, no scheme) of the rules whose credential has
delivery: kubelet: the kubelet calls the plugin for these images only. */}}
{{- define "mirrorgate.kubeletPlugin.matchImages" -}}
{{- $grants := .Values.policy.credentials | default dict -}}
{{- $images := list -}}
{{- range .Values.policy.mirrors | default list -}}
{{- $grant := get $grants (.credential | default "") -}}
{{- if and .credential $grant (eq ($grant.delivery | default "pullSecret") "kubelet") -}}
{{- $images = append $images (.mirror | trimPrefix "https://" | trimPrefix "http://") -}}
{{- end -}}
{{- end -}}
{{- $images | uniq | toJson -}}
{{- end }}

{{/* The URL the plugin posts to: the fixed ClusterIP, which nodes reach without
cluster DNS (an IPv6 address in brackets). */}}
{{- define "mirrorgate.kubeletPlugin.url" -}}
{{- $ip := .Values.kubeletPlugin.clusterIP | default "CLUSTER-IP" -}}
{{- if contains ":" $ip -}}
https://[{{ $ip }}]/kubelet-credentials
{{- else -}}
https://{{ $ip }}/kubelet-credentials
{{- end -}}
{{- end }}

{{/* The kubelet's CredentialProviderConfig entry (kubelet.config.k8s.io/v1). */}}
{{- define "mirrorgate.kubeletPlugin.provider" -}}
- name: mirrorgate-credential-provider
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  matchImages: {{ include "mirrorgate.kubeletPlugin.matchImages" . }}
  defaultCacheDuration: {{ .Values.kubeletPlugin.defaultCacheDuration }}
  args:
    - --url={{ include "mirrorgate.kubeletPlugin.url" . }}
    - --ca-file={{ .Values.kubeletPlugin.binDir }}/mirrorgate-ca.crt
  tokenAttributes:
    serviceAccountTokenAudience: {{ .Values.kubeletPlugin.audience }}
    cacheType: ServiceAccount
    requireServiceAccount: true
{{- end }}
