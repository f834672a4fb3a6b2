{{/* Helpers of the fencegate chart: names, labels, images, the sidecar config, TLS material. */}}

{{/* The chart's name, overridable. */}}
{{- define "fencegate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Base name of every object: <release>-<chart>, or the release name when it already holds the
chart name. Truncated so that suffixes like "-injector" still fit in 63 characters. */}}
{{- define "fencegate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "fencegate.injectorName" -}}
{{- printf "%s-injector" (include "fencegate.fullname" .) -}}
{{- end -}}

{{- define "fencegate.tlsSecretName" -}}
{{- default (printf "%s-injector-tls" (include "fencegate.fullname" .)) .Values.tls.existingSecret -}}
{{- end -}}

{{- define "fencegate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "fencegate.injectorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The ConfigMap holding the sidecar's fencegate.yaml; pods name it in fencegate.io/config. */}}
{{- define "fencegate.sidecarConfigName" -}}
{{- printf "%s-sidecar-config" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fencegate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "fencegate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fencegate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "fencegate.labels" -}}
helm.sh/chart: {{ include "fencegate.chart" . }}
{{ include "fencegate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is given; the tag defaults to appVersion. */}}
{{- define "fencegate.imageRef" -}}
{{- $img := .image -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default .appVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{- define "fencegate.injectorImage" -}}
{{- include "fencegate.imageRef" (dict "image" .Values.image "appVersion" .Chart.AppVersion) -}}
{{- end -}}

{{/* The sidecar's image: sidecar.image where set, else the chart's image. */}}
{{- define "fencegate.sidecarImage" -}}
{{- $img := dict "repository" (default .Values.image.repository .Values.sidecar.image.repository) -}}
{{- if .Values.sidecar.image.repository -}}
{{- $_ := set $img "tag" .Values.sidecar.image.tag -}}
{{- $_ := set $img "digest" .Values.sidecar.image.digest -}}
{{- else -}}
{{- $_ := set $img "tag" (default .Values.image.tag .Values.sidecar.image.tag) -}}
{{- $_ := set $img "digest" (default .Values.image.digest .Values.sidecar.image.digest) -}}
{{- end -}}
{{- include "fencegate.imageRef" (dict "image" $img "appVersion" .Chart.AppVersion) -}}
{{- end -}}

{{/* The lock backend the sidecar uses: sidecar.backend.url, else the upstream Redis. */}}
{{- define "fencegate.sidecarBackend" -}}
{{- default .Values.sidecar.upstream.url .Values.sidecar.backend.url -}}
{{- end -}}

{{/* Checks the schema cannot express; fails the render with what to change. */}}
{{- define "fencegate.validate" -}}
{{- $names := list .Values.sidecar.upstream.storeName -}}
{{- range .Values.sidecar.stores -}}
{{- if has .name $names -}}
{{- fail (printf "sidecar.stores: the store name %q is used twice (sidecar.upstream.storeName is %q); store names must be unique" .name $.Values.sidecar.upstream.storeName) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- range .Values.sidecar.protect -}}
{{- if not (has .store $names) -}}
{{- fail (printf "sidecar.protect: rule for keys %q names store %q, which is not defined; defined stores: %s" .keys .store (join ", " $names)) -}}
{{- end -}}
{{- end -}}
{{- $pdb := .Values.injector.podDisruptionBudget -}}
{{- if and $pdb.enabled (gt (int .Values.injector.replicas) 1) (ge (int $pdb.minAvailable) (int .Values.injector.replicas)) -}}
{{- fail (printf "injector.podDisruptionBudget.minAvailable (%d) must be below injector.replicas (%d), or no node could ever be drained" (int $pdb.minAvailable) (int .Values.injector.replicas)) -}}
{{- end -}}
{{- if and .Values.tls.existingSecret .Values.tls.certManager.enabled -}}
{{- fail "tls: set either tls.existingSecret or tls.certManager.enabled, not both" -}}
{{- end -}}
{{- end -}}

{{/*
The webhook's serving certificate when the chart makes it (neither cert-manager nor
tls.existingSecret): the one in the existing Secret when there is one (lookup: upgrades keep the
certificate and the webhook's caBundle stable), else a new CA and a certificate it signs.
Computed once per render and kept on the root context, so the Secret, the webhook's caBundle and
the Deployment's checksum annotation all see the same material. Returns JSON with base64 values:
{"ca": ..., "crt": ..., "key": ..., "reused": bool}.
*/}}
{{- define "fencegate.tlsMaterial" -}}
{{- if not (hasKey $ "fencegateTLSMaterial") -}}
{{- $m := dict "reused" false -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "fencegate.tlsSecretName" .) -}}
{{- if and $secret $secret.data (index $secret.data "tls.crt") (index $secret.data "tls.key") (index $secret.data "ca.crt") -}}
{{- $_ := set $m "ca" (index $secret.data "ca.crt") -}}
{{- $_ := set $m "crt" (index $secret.data "tls.crt") -}}
{{- $_ := set $m "key" (index $secret.data "tls.key") -}}
{{- $_ := set $m "reused" true -}}
{{- else -}}
{{- $svc := include "fencegate.injectorName" . -}}
{{- $ns := .Release.Namespace -}}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) -}}
{{- $ca := genCA (printf "%s-ca" $svc) (int .Values.tls.validityDays) -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc $ns) nil $dns (int .Values.tls.validityDays) $ca -}}
{{- $_ := set $m "ca" ($ca.Cert | b64enc) -}}
{{- $_ := set $m "crt" ($cert.Cert | b64enc) -}}
{{- $_ := set $m "key" ($cert.Key | b64enc) -}}
{{- end -}}
{{- $_ := set $ "fencegateTLSMaterial" $m -}}
{{- end -}}
{{- get $ "fencegateTLSMaterial" | toJson -}}
{{- end -}}

{{- define "fencegate.tlsGenerated" -}}
{{- if not (or .Values.tls.certManager.enabled .Values.tls.existingSecret) -}}true{{- end -}}
{{- end -}}
