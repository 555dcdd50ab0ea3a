{{/* Labels on every object; selectors use lifeline.selector only, which never changes across upgrades. */}}
{{- define "lifeline.labels" -}}
app.kubernetes.io/part-of: lifeline
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* lifeline.labels and which part of Lifeline the object is: (list $ "controller"). Selectors never hold the
component: a Deployment's or DaemonSet's selector cannot change on upgrade. */}}
{{- define "lifeline.componentLabels" -}}
app.kubernetes.io/component: {{ index . 1 }}
{{ include "lifeline.labels" (index . 0) }}
{{- end }}

{{/* Where the controller's pods run: controller.nodeSelector, .tolerations and .affinity, with the rule that
keeps them off edge nodes added to each required node-affinity term (the terms are alternatives: a term without it
would let the scheduler pick an edge node). */}}
{{- define "lifeline.controllerScheduling" -}}
{{- $c := .Values.controller -}}
{{- $affinity := deepCopy ($c.affinity | default dict) -}}
{{- $node := $affinity.nodeAffinity | default dict -}}
{{- $required := $node.requiredDuringSchedulingIgnoredDuringExecution | default dict -}}
{{- $offEdge := dict "key" "node-role.kubernetes.io/edge" "operator" "DoesNotExist" -}}
{{- $terms := list -}}
{{- range $required.nodeSelectorTerms | default (list dict) -}}
{{- $terms = append $terms (merge (dict "matchExpressions" (append (.matchExpressions | default list) $offEdge)) .) -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ = set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ = set $affinity "nodeAffinity" $node -}}
{{- with $c.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
affinity: {{- toYaml $affinity | nindent 2 }}
{{- end }}

{{- define "lifeline.image" -}}
{{- $img := index . 0 -}}{{- $root := index . 1 -}}
{{ $img.repository }}:{{ $img.tag | default $root.Chart.AppVersion }}{{ with $img.digest }}@{{ . }}{{ end }}
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

{{/* "true" when the controller makes the broker's CA and certificate at run time (broker.tls.generatedBy). */}}
{{- define "lifeline.brokerTLSByController" -}}
{{- $t := .Values.broker.tls -}}
{{- if not (has $t.generatedBy (list "controller" "helm")) }}{{ fail (printf "broker.tls.generatedBy must be controller or helm, not %q" $t.generatedBy) }}{{ end -}}
{{- if and (not $t.existingSecret) (not $t.certManager.issuerRef.name) (eq $t.generatedBy "controller") }}true{{ end -}}
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

{{/* Fails the render on values that cannot work, before anything is applied. Each value's type, enum and range
are values.schema.json's, which helm checks first; these are the rules that span several values or that a schema
cannot say. */}}
{{- define "lifeline.validate" -}}
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

{{/* The agent's container securityContext, the DaemonSet pod's and its standby's alike: root without any
capability (the CRI socket, the state directory and the static-pod directory are root's own). */}}
{{- define "lifeline.agentSecurityContext" -}}
runAsUser: 0
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: ["ALL"]}
seccompProfile: {type: RuntimeDefault}
{{- end }}
