{{/* Chart name, truncated to a DNS label. */}}
{{- define "palisade.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name: "<release>-palisade", or the release name when it already contains the chart name.
Cluster-scoped objects (ClusterRoles, admission policies) are named after it, so two releases
in one cluster must have different full names. Truncated so that "<fullname>-object-fencing"
still fits a DNS label.
*/}}
{{- define "palisade.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 48 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 48 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 48 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "palisade.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "palisade.selectorLabels" -}}
app.kubernetes.io/name: {{ include "palisade.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "palisade.labels" -}}
helm.sh/chart: {{ include "palisade.chart" . }}
{{ include "palisade.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: palisade
{{- end -}}

{{- define "palisade.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "palisade.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "palisade.electionLeaseName" -}}
{{- default (printf "%s-controller" (include "palisade.fullname" .)) .Values.controller.leaderElection.leaseName -}}
{{- end -}}

{{- define "palisade.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The bindings' namespaceSelector (empty: every namespace). */}}
{{- define "palisade.policyNamespaceSelector" -}}
{{- with .Values.policies.namespaceSelector }}
{{- toYaml . }}
{{- else -}}
{}
{{- end -}}
{{- end -}}

{{/* A binding's validationActions; the API refuses Deny together with Warn, so say so early. */}}
{{- define "palisade.validationActions" -}}
{{- $key := index . 0 -}}
{{- $actions := index . 1 -}}
{{- if and (has "Deny" $actions) (has "Warn" $actions) -}}
{{- fail (printf "%s: Deny and Warn cannot be combined (Deny already reports the message to the client)" $key) -}}
{{- end -}}
{{- toJson $actions -}}
{{- end -}}
