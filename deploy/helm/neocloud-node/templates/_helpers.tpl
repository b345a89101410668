{{/* The name of every object; the kustomize install's is aibrix-neocloud-node. */}}
{{- define "neocloud-node.fullname" -}}
{{- required "fullname must be set" .Values.fullname | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels selecting the node's Pods: the same as the kustomize install's, so either can take
over from the other. */}}
{{- define "neocloud-node.selectorLabels" -}}
app.kubernetes.io/name: {{ include "neocloud-node.fullname" . }}
{{- end -}}

{{- define "neocloud-node.labels" -}}
{{ include "neocloud-node.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "neocloud-node.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The node's configuration file (neocloud-node run --config), from the values. Providers are
left to GPU_BURST_PROVIDER, as in config/manager/node.yaml; an empty clusterId is left out, so
the node derives it. */}}
{{- define "neocloud-node.config" -}}
{{- $c := dict "node" (dict "name" .Values.nodeName) "metricsAddress" "0.0.0.0:8080" -}}
{{- $_ := set $c "policies" (dict "cacheDir" "/var/cache/neocloud-node/wasm") -}}
{{- with .Values.clusterId -}}
{{- $_ := set $c "clusterId" (toString .) -}}
{{- end -}}
{{- if not (kindIs "invalid" .Values.budgetUsdPerHour) -}}
{{- /* float64: `--set budgetUsdPerHour=25.5` arrives as a string. */ -}}
{{- $_ := set $c "budgetUsdPerHour" (float64 .Values.budgetUsdPerHour) -}}
{{- end -}}
{{- with .Values.sweeper -}}
{{- $_ := set $c "sweeper" . -}}
{{- end -}}
{{- with .Values.watchNamespaces -}}
{{- $_ := set $c "watchNamespaces" . -}}
{{- end -}}
{{- $c = mergeOverwrite $c (deepCopy .Values.extraConfig) -}}
{{- toYaml $c -}}
{{- end -}}

{{/* An optional environment variable from one of the provider Secrets. */}}
{{- define "neocloud-node.secretEnv" -}}
- name: {{ .key }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .key }}
      optional: true
{{- end -}}
