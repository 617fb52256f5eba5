{{/* Labels on every object. */}}
{{- define "gpu-binder.labels" -}}
app.kubernetes.io/name: gpu-binder
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The controller Pods' selector: the same as the kustomize base (one release per cluster). */}}
{{- define "gpu-binder.selectorLabels" -}}
app.kubernetes.io/name: gpu-binder
{{- end }}

{{- define "gpu-binder.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* The controller's config file (k8s/config.py field names), from .Values.settings. */}}
{{- define "gpu-binder.config" -}}
{{- $cfg := dict "raw_resource_names" .Values.rawResourceNames "settings_namespace" .Release.Namespace "lease_namespace" .Release.Namespace -}}
{{- range $k, $v := .Values.settings }}
{{- if not (kindIs "invalid" $v) }}
{{- $_ := set $cfg (snakecase $k) $v }}
{{- end }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* Checks across values that the schema cannot express; fail with the value's name. */}}
{{- define "gpu-binder.validate" -}}
{{- $s := .Values.settings -}}
{{- $bind := $s.bindTimeout | default 20 | float64 -}}
{{- if gt (addf $bind 3) (float64 .Values.webhook.timeoutSeconds) -}}
{{- fail (printf "settings.bindTimeout (%v s) must be at least 3 s below webhook.timeoutSeconds (%v s): a review needs time around the wait" $bind .Values.webhook.timeoutSeconds) -}}
{{- end -}}
{{- $ld := $s.leaseDuration | default 10 | float64 -}}
{{- $rd := $s.renewDeadline | default 7 | float64 -}}
{{- $rp := $s.retryPeriod | default 1 | float64 -}}
{{- if not (and (gt $ld $rd) (gt $rd $rp)) -}}
{{- fail (printf "settings: leaseDuration (%v) > renewDeadline (%v) > retryPeriod (%v) is required" $ld $rd $rp) -}}
{{- end -}}
{{- if ge $bind ($s.attachmentGrace | default 120 | float64) -}}
{{- fail "settings.bindTimeout must be shorter than settings.attachmentGrace" -}}
{{- end -}}
{{- if and (eq .Values.webhook.certificate.source "secret") (not .Values.webhook.certificate.caBundle) -}}
{{- fail "webhook.certificate.caBundle is required when webhook.certificate.source=secret (base64 of the PEM CA certificate that signed the Secret's tls.crt)" -}}
{{- end -}}
{{- end }}
