{{/* Labels on every object; selectors use lifeline.selector only, which never changes across upgrades. */}}
{{- define "lifeline.labels" -}}
app.kubernetes.io/part-of: lifeline
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "lifeline.image" -}}
{{- $img := index . 0 -}}{{- $root := index . 1 -}}
{{ $img.repository }}:{{ $img.tag | default $root.Chart.AppVersion }}
{{- end }}

{{/* The Service's DNS names, which are always in the broker certificate. */}}
{{- define "lifeline.brokerDNSNames" -}}
{{- $ns := .Release.Namespace -}}
{{- list "lifeline-broker" (printf "lifeline-broker.%s" $ns) (printf "lifeline-broker.%s.svc" $ns) (printf "lifeline-broker.%s.svc.%s" $ns .Values.clusterDomain) | toJson -}}
{{- end }}

{{/* An advertised address is an IP when it is all digits and dots (IPv4) or holds a colon (IPv6). */}}
{{- define "lifeline.isIP" -}}
{{- if or (regexMatch "^[0-9.]+$" .) (contains ":" .) }}true{{ end -}}
{{- end }}

{{/* Every name of the broker certificate, in a stable order: its digest tells when a new certificate is due. */}}
{{- define "lifeline.brokerSANs" -}}
{{- concat .Values.broker.advertiseAddress (include "lifeline.brokerDNSNames" . | fromJsonArray) | join "," -}}
{{- end }}

{{/* What the agents dial: ssl://<first advertised address>:<the port it exposes>, else the Service's DNS name. */}}
{{- define "lifeline.brokerURL" -}}
{{- $b := .Values.broker -}}
{{- if $b.advertiseAddress -}}
{{- $host := first $b.advertiseAddress -}}
{{- if contains ":" $host }}{{ $host = printf "[%s]" $host }}{{ end -}}
{{- $port := $b.port -}}
{{- if eq $b.service.type "NodePort" }}{{ $port = required "broker.service.nodePort is required with type NodePort: the agents dial it" $b.service.nodePort }}{{ end -}}
ssl://{{ $host }}:{{ $port }}
{{- else -}}
ssl://lifeline-broker.{{ .Release.Namespace }}.svc:{{ $b.port }}
{{- end -}}
{{- end }}

{{/* Fails the render on values that cannot work, before anything is applied. */}}
{{- define "lifeline.validate" -}}
{{- if not (has .Values.nodeIdentity.mode (list "kubeedgeCert" "password")) -}}
{{- fail (printf "nodeIdentity.mode is %q; want kubeedgeCert or password" .Values.nodeIdentity.mode) -}}
{{- end -}}
{{- if not (has .Values.broker.service.type (list "ClusterIP" "NodePort" "LoadBalancer")) -}}
{{- fail (printf "broker.service.type is %q; want ClusterIP, NodePort or LoadBalancer" .Values.broker.service.type) -}}
{{- end -}}
{{- if lt (int .Values.controller.replicas) 1 -}}
{{- fail "controller.replicas must be at least 1" -}}
{{- end -}}
{{- range .Values.controller.namespaces -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" .) -}}
{{- fail (printf "controller.namespaces holds %q, which is no namespace name" .) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.broker.revokedCertificates.configMap (ne .Values.nodeIdentity.mode "kubeedgeCert") -}}
{{- fail "broker.revokedCertificates lists certificates, which only nodeIdentity.mode kubeedgeCert admits: revoke a password by removing it from the Secret" -}}
{{- end -}}
{{- if and .Values.broker.revokedCertificates.configMap (not .Values.broker.revokedCertificates.key) -}}
{{- fail "broker.revokedCertificates.key is required with broker.revokedCertificates.configMap" -}}
{{- end -}}
{{- range .Values.agent.datasetDirs -}}
{{- if or (not (isAbs .)) (ne (clean .) .) (eq . "/") -}}
{{- fail (printf "agent.datasetDirs holds %q; want absolute, clean node directories other than /" .) -}}
{{- end -}}
{{- end -}}
{{- end }}
