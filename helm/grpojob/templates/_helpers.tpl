{{/* Names, labels, images and RBAC rules: each defined once here. */}}

{{- define "grpojob.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "grpojob.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "grpojob.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Operator selector labels. component=operator keeps them apart from the job pods the operator
creates, which carry app.kubernetes.io/name=grpojob too. */}}
{{- define "grpojob.selectorLabels" -}}
app.kubernetes.io/name: {{ include "grpojob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "grpojob.labels" -}}
helm.sh/chart: {{ include "grpojob.chart" . }}
{{ include "grpojob.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: grpojob
{{- end }}

{{- define "grpojob.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "grpojob.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "grpojob.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "grpojob.runtimeImage" -}}
{{- printf "%s:%s" .Values.runtimeImage.repository (default .Chart.AppVersion .Values.runtimeImage.tag) }}
{{- end }}

{{/* An address as the host of a URL: IPv6 in brackets. */}}
{{- define "grpojob.urlHost" -}}
{{- if contains ":" . }}[{{ . }}]{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* Leader election (kopf peering): on with more than one replica, or when asked for. */}}
{{- define "grpojob.peering" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicaCount) 1) }}true{{- end }}
{{- end }}

{{/* RBAC: exactly what the operator calls. operator/grpojob_operator/rbac.py (RBAC_RULES) is the
list; a chart test keeps these rules equal to it. Namespaced resources: a Role in each watched
namespace, or the ClusterRole. */}}
{{- define "grpojob.rules.namespaced" -}}
# The jobs: watched by kopf, annotated (kopf progress, restart ledger), deleted after their TTL.
- apiGroups: [grpojob.io]
  resources: [grpojobs]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [grpojob.io]
  resources: [grpojobs/status]
  verbs: [get, patch]
# Children set blockOwnerDeletion on their owner reference: OwnerReferencesPermissionEnforcement
# (on in OpenShift) requires update on the owner's finalizers.
- apiGroups: [grpojob.io]
  resources: [grpojobs/finalizers]
  verbs: [update]
# Children: watched into kopf indexes, created, patched back into shape (deleted by ownerReferences;
# a judge's Deployment and Service by the operator when the judge leaves spec.judges).
- apiGroups: [""]
  resources: [configmaps]
  verbs: [list, watch, create, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [list, watch, create, patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# Each job's token: its Secret is created once and read back (never patched, listed or watched).
# RBAC cannot narrow `get` to the Secrets the operator owns: watchNamespaces narrows it to the
# namespaces it serves.
- apiGroups: [""]
  resources: [secrets]
  verbs: [create, get]
# Each job's NetworkPolicies (spec.network.policy): watched like the other children (an edited or
# deleted one is put back), deleted when a job turns them off.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch, create, patch, delete]
# Optional children: spec.scheduling.gang=volcano, spec.monitoring.podMonitor.
- apiGroups: [scheduling.volcano.sh]
  resources: [podgroups]
  verbs: [create, patch]
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors]
  verbs: [create, patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if and (include "grpojob.peering" .) .Values.watchNamespaces }}
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end }}

{{/* Cluster-scoped rules: kopf discovers resources through CRDs and follows namespaces; in cluster
mode it peers through a ClusterKopfPeering. */}}
{{- define "grpojob.rules.cluster" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- if and (include "grpojob.peering" .) (not .Values.watchNamespaces) }}
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end }}
