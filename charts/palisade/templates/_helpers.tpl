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

{{/*
A duration value ("750ms", "15s", "2m", "1h": a whole number and a unit) in milliseconds,
for comparing the election timings. Called with (list "values.key" value); fails naming the
key when the value is not such a duration (values.schema.json checks the same, this keeps
the check when the schema is skipped).
*/}}
{{- define "palisade.durationMs" -}}
{{- $key := index . 0 -}}
{{- $value := toString (index . 1) -}}
{{- if not (regexMatch "^[0-9]{1,9}(ms|s|m|h)$" $value) -}}
{{- fail (printf "%s: %q is not a duration: expected a whole number and a unit, ms, s, m or h (e.g. 750ms, 15s, 2m)" $key $value) -}}
{{- end -}}
{{- $n := regexFind "^[0-9]+" $value | atoi -}}
{{- $unit := trimPrefix (regexFind "^[0-9]+" $value) $value -}}
{{- $perUnit := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 -}}
{{- mul $n (get $perUnit $unit) -}}
{{- end -}}

{{/*
The election timings as the controller requires them (src/controller/election.rs): leaseDuration whole
seconds from 1s to 24h, leaseDuration > renewDeadline > retryPeriod > 0. A leader whose
renewal fails stops granting once renewDeadline has passed since its last success; that should
come before a standby may take over (leaseDuration), and leave room for more than one try
(retryPeriod).
Renders nothing; fails with a message naming the values.
*/}}
{{- define "palisade.checkElectionTimings" -}}
{{- $e := .Values.controller.leaderElection -}}
{{- $lease := include "palisade.durationMs" (list "controller.leaderElection.leaseDuration" $e.leaseDuration) | atoi -}}
{{- $renew := include "palisade.durationMs" (list "controller.leaderElection.renewDeadline" $e.renewDeadline) | atoi -}}
{{- $retry := include "palisade.durationMs" (list "controller.leaderElection.retryPeriod" $e.retryPeriod) | atoi -}}
{{- if or (lt $lease 1000) (gt $lease 86400000) (ne (mod $lease 1000) 0) -}}
{{- fail (printf "controller.leaderElection.leaseDuration: %q must be whole seconds from 1s to 24h (it is the election Lease's leaseDurationSeconds)" (toString $e.leaseDuration)) -}}
{{- end -}}
{{- if ge $renew $lease -}}
{{- fail (printf "controller.leaderElection.renewDeadline (%s) must be shorter than controller.leaderElection.leaseDuration (%s): a leader must stop granting before a standby may take over" (toString $e.renewDeadline) (toString $e.leaseDuration)) -}}
{{- end -}}
{{- if or (le $retry 0) (ge $retry $renew) -}}
{{- fail (printf "controller.leaderElection.retryPeriod (%s) must be greater than zero and shorter than controller.leaderElection.renewDeadline (%s): a leader needs more than one try to renew" (toString $e.retryPeriod) (toString $e.renewDeadline)) -}}
{{- end -}}
{{- end -}}
