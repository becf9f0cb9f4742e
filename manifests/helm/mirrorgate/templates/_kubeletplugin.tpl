{{/* Secretless pulls (kubeletPlugin): the names and the kubelet's configuration. */}}

{{/* Secretless pulls need Kubernetes 1.34 or newer: from 1.34 (KEP-4412, beta and on
by default) a kubelet sends its credential provider the Pod's service-account token,
the only thing the endpoint trusts. On an older cluster the plugin would get no token
and every pull of a kubelet-delivered image would be refused, so the chart refuses to
render instead. `helm install`/`upgrade` read the cluster's version; `helm template`
takes it from --kube-version (helm's own client version without it). "-0" lets a
provider's build of 1.34 (v1.34.2-eks-...) through; Minor may end in "+" (GKE, EKS). */}}
{{- define "mirrorgate.kubeletPlugin.supported" -}}
{{- $found := .Capabilities.KubeVersion -}}
{{- if semverCompare "<1.34.0-0" $found.Version -}}
{{- fail (printf "kubeletPlugin.enabled: secretless pulls need Kubernetes 1.34 or newer (service-account tokens for kubelet credential providers, KEP-4412), and this cluster is %s.%s (%s); keep delivery: pullSecret there and leave kubeletPlugin.enabled false" $found.Major ($found.Minor | trimSuffix "+") $found.Version) -}}
{{- end -}}
{{- end }}

{{- define "mirrorgate.kubeletPlugin.name" -}}
{{ include "mirrorgate.fullname" . | trunc 48 | trimSuffix "-" }}-kubelet-plugin
{{- end }}

{{/* The plugin's Pods: not the server's selector label, so that no Service of
mirrorgate's ever sends them a request. */}}
{{- define "mirrorgate.kubeletPlugin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mirrorgate.name" . | trunc 48 | trimSuffix "-" }}-kubelet-plugin
app.kubernetes.io/part-of: {{ include "mirrorgate.name" . }}
{{- end }}

{{/* The mirrors (host and path, no scheme) to which a credential with delivery: kubelet
applies: the kubelet calls the plugin for these images only. As the policy loader reads
a rule (policy/mirrorlists.py): `mirror` is one URL, which has the rule's `credential`,
or a list whose entries are URLs (no credential) or {url, credential} mappings (their
own credential only: the rule's is refused next to a list, and never inherited); a
`credential` is one name or a list, one per team. A mirror is listed when any of its
credentials is granted in `credentials` with delivery: kubelet. */}}
{{- define "mirrorgate.kubeletPlugin.matchImages" -}}
{{- $grants := .Values.policy.credentials | default dict -}}
{{- $images := list -}}
{{- range $rule := .Values.policy.mirrors | default list -}}
{{- $entries := list -}}
{{- if kindIs "slice" $rule.mirror -}}
{{- range $rule.mirror -}}
{{- if kindIs "map" . -}}
{{- $entries = append $entries (dict "url" .url "credential" .credential) -}}
{{- else -}}
{{- $entries = append $entries (dict "url" . "credential" list) -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- $entries = append $entries (dict "url" $rule.mirror "credential" $rule.credential) -}}
{{- end -}}
{{- range $entries -}}
{{- $names := .credential | default list -}}
{{- if not (kindIs "slice" $names) -}}
{{- $names = list $names -}}
{{- end -}}
{{- $kubelet := false -}}
{{- range $names -}}
{{- $grant := get $grants (toString .) -}}
{{- if and $grant (kindIs "map" $grant) (eq ($grant.delivery | default "pullSecret") "kubelet") -}}
{{- $kubelet = true -}}
{{- end -}}
{{- end -}}
{{- if and $kubelet .url -}}
{{- $images = append $images (toString .url | trimPrefix "https://" | trimPrefix "http://") -}}
{{- end -}}
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
