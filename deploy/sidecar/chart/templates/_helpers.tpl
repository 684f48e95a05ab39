{{/*
csi-provisioner.name: the chart's name, capped at 63 characters.
*/}}
{{- define "csi-provisioner.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
csi-provisioner.fullname: the prefix of every namespaced object and of the
cluster-wide RBAC objects. The release name alone when it already contains
the chart's name, else "<release>-csi-provisioner"; capped at 63 characters.
*/}}
{{- define "csi-provisioner.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
csi-provisioner.chart: "<name>-<version>" for the helm.sh/chart label.
*/}}
{{- define "csi-provisioner.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
csi-provisioner.selectorLabels: the labels the Deployment and the Service
select the pods by. They never change after install.
*/}}
{{- define "csi-provisioner.selectorLabels" -}}
app.kubernetes.io/name: {{ include "csi-provisioner.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{/*
csi-provisioner.labels: the labels of every object: the selector labels,
the version, the manager, helm.sh/chart and customLabels.
*/}}
{{- define "csi-provisioner.labels" -}}
{{ include "csi-provisioner.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: csi-provisioner
helm.sh/chart: {{ include "csi-provisioner.chart" . }}
{{- with .Values.customLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
csi-provisioner.serviceAccountName: the ServiceAccount the pod runs as.
*/}}
{{- define "csi-provisioner.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "csi-provisioner.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
csi-provisioner.image: "repository:tag" of an image block (dict "image"
IMAGE "root" $); the tag defaults to the chart's appVersion.
*/}}
{{- define "csi-provisioner.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/*
csi-provisioner.hasArg: "true" when the list .args has the flag .flag, as
-flag or --flag, alone or with a value (=v or a following word), or, for a
one-letter flag (-v), with a number attached (-v5); else "".
*/}}
{{- define "csi-provisioner.hasArg" -}}
{{- $attached := ternary (printf "|(^| )-%s[0-9]" (regexQuoteMeta .flag)) "" (eq (len .flag) 1) -}}
{{- if regexMatch (printf "(^| )--?%s(=| |$)%s" (regexQuoteMeta .flag) $attached) (join " " .args) -}}true{{- end -}}
{{- end -}}

{{/*
csi-provisioner.hasEnv: "true" when the list of EnvVar objects .env has one
named .name; else "".
*/}}
{{- define "csi-provisioner.hasEnv" -}}
{{- range .env }}{{ if eq .name $.name }}true{{ end }}{{ end -}}
{{- end -}}

{{/*
csi-provisioner.leaderElection: "true" when the sidecar runs with
--leader-election (sidecar.leaderElection.enabled, and not in node
deployment, where every node's pod works for its node); else "".
*/}}
{{- define "csi-provisioner.leaderElection" -}}
{{- if and .Values.sidecar.leaderElection.enabled (not .Values.nodeDeployment.enabled) -}}true{{- end -}}
{{- end -}}

{{/*
csi-provisioner.namespacedRBAC: "true" when the sidecar needs the Role in
the release's namespace: for leader election's Lease or for the
CSIStorageCapacity objects; else "".
*/}}
{{- define "csi-provisioner.namespacedRBAC" -}}
{{- if or (include "csi-provisioner.leaderElection" .) .Values.sidecar.capacity.enabled -}}true{{- end -}}
{{- end -}}

{{/*
csi-provisioner.seconds: the Go duration . (as the schema accepts them:
15s, 1m30s, 500ms) in seconds, as a float; "0" for "".
*/}}
{{- define "csi-provisioner.seconds" -}}
{{- $total := 0.0 -}}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- range regexFindAll "[0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h)" (toString .) -1 -}}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" . | float64 -}}
{{- $unit := regexReplaceAll "^[0-9]+(\\.[0-9]+)?" . "" -}}
{{- $total = addf $total (mulf $num (get $units $unit)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
csi-provisioner.metricsServiceName: "<fullname>-metrics", a DNS-1035 label
as a Service name must be: the fullname cut to 55 characters and its dots
(which Helm allows in a release name) made dashes; "metrics-<fullname>"
when the release name begins with a digit.
*/}}
{{- define "csi-provisioner.metricsServiceName" -}}
{{- $base := include "csi-provisioner.fullname" . | replace "." "-" | trunc 55 | trimSuffix "-" -}}
{{- if regexMatch "^[0-9]" $base -}}
{{- printf "metrics-%s" $base -}}
{{- else -}}
{{- printf "%s-metrics" $base -}}
{{- end -}}
{{- end -}}

{{/*
csi-provisioner.clusterName: the prefix of the cluster-scoped RBAC objects:
"<fullname>-<namespace>", so that releases of the same name in two
namespaces (two drivers, each installed with the README's command) do not
claim the same ClusterRole and ClusterRoleBinding.
*/}}
{{- define "csi-provisioner.clusterName" -}}
{{- printf "%s-%s" (include "csi-provisioner.fullname" .) .Release.Namespace -}}
{{- end -}}
