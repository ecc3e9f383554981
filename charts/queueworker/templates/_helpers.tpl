{{/* The chart's short name. */}}
{{- define "queueworker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the prefix of every object's name (leaves room for suffixes). */}}
{{- define "queueworker.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else if contains (include "queueworker.name" .) .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "queueworker.name" .) | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "queueworker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "queueworker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component; call with (dict "root" $ "component" "controller"). */}}
{{- define "queueworker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "queueworker.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "queueworker.componentLabels" -}}
{{ include "queueworker.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "queueworker.controllerName" -}}
{{ include "queueworker.fullname" . }}-controller
{{- end }}

{{- define "queueworker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "queueworker.controllerName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An address as a URL's host: IPv6 literals in brackets. */}}
{{- define "queueworker.urlHost" -}}
{{- if contains ":" . }}[{{ . }}]{{ else }}{{ . }}{{ end }}
{{- end }}

{{- define "queueworker.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "queueworker.demoPostgresName" -}}
{{ include "queueworker.fullname" . }}-demo-postgres
{{- end }}

{{/* The controller's rules (files/controller-rules.yaml) that only a ClusterRoleBinding can grant:
     those on cluster-scoped resources. */}}
{{- define "queueworker.clusterScopedRules" -}}
{{- $clusterScoped := list "customresourcedefinitions" "namespaces" }}
{{- range $rule := .Files.Get "files/controller-rules.yaml" | fromYamlArray }}
{{- $clusterWide := false }}
{{- range $rule.resources }}{{ if has . $clusterScoped }}{{ $clusterWide = true }}{{ end }}{{ end }}
{{- if $clusterWide }}
- {{ toYaml $rule | nindent 2 | trim }}
{{- end }}
{{- end }}
{{- end }}

{{/* What the chart adds to the CRD's metadata: labels, and the keep policy. */}}
{{- define "queueworker.crdMetadata" -}}
labels:
  {{- include "queueworker.labels" . | nindent 2 }}
{{- if .Values.crds.keep }}
annotations:
  helm.sh/resource-policy: keep
{{- end }}
{{- end }}

{{/* Removes, in place, every CEL rule with reason FieldValueForbidden (the pod-security rules)
     from a schema node and everything below it. Renders nothing. */}}
{{- define "queueworker.dropForbiddingRules" -}}
{{- if kindIs "map" . }}
{{- $rules := get . "x-kubernetes-validations" }}
{{- if $rules }}
{{- $kept := list }}
{{- range $rules }}{{ if ne (get . "reason") "FieldValueForbidden" }}{{ $kept = append $kept . }}{{ end }}{{ end }}
{{- if $kept }}{{ $_ := set . "x-kubernetes-validations" $kept }}{{ else }}{{ $_ := unset . "x-kubernetes-validations" }}{{ end }}
{{- end }}
{{- range $key, $value := . }}{{ include "queueworker.dropForbiddingRules" $value }}{{ end }}
{{- else if kindIs "slice" . }}
{{- range . }}{{ include "queueworker.dropForbiddingRules" . }}{{ end }}
{{- end }}
{{- end }}

{{/* The egress rules of the controller's and the console's NetworkPolicies: the API server, DNS and
the databases (networkPolicy.apiServer, dns, databaseEgress). */}}
{{- define "queueworker.commonEgress" -}}
{{- $policy := .Values.networkPolicy -}}
# The API server.
- ports:
    {{- range $policy.apiServer.ports }}
    - {port: {{ . }}, protocol: TCP}
    {{- end }}
  {{- with $policy.apiServer.cidrs }}
  to:
    {{- range . }}
    - ipBlock: {cidr: {{ . | quote }}}
    {{- end }}
  {{- end }}
{{- if $policy.dns }}
- ports:
    - {port: 53, protocol: UDP}
    - {port: 53, protocol: TCP}
{{- end }}
{{- with $policy.databaseEgress }}
# The databases.
{{ toYaml . }}
{{- end }}
{{- end }}
