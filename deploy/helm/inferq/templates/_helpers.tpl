{{/*
Helpers of the inferq chart: names and labels, the image, where the Redis URL and the config
files come from, Go durations read as seconds, and the checks that refuse a values set which
would deploy something broken (each with a message naming the value to fix).
*/}}

{{- define "inferq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "inferq.fullname" -}}
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

{{/* The name of one component's objects: "<fullname>-<suffix>", cut to 63 characters. */}}
{{- define "inferq.componentName" -}}
{{- printf "%s-%s" (include "inferq.fullname" .root | trunc (int (sub 62 (len .suffix))) | trimSuffix "-") .suffix }}
{{- end }}

{{- define "inferq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "inferq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ regexReplaceAll "[^-A-Za-z0-9_.]" (include "inferq.tag" .) "_" | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: inferq
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of a component (processor or batch-api): dict "root" $ "component" "...". */}}
{{- define "inferq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "inferq.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "inferq.componentLabels" -}}
{{ include "inferq.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "inferq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "inferq.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "inferq.tag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "inferq.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "inferq.tag" .) }}
{{- end }}

{{/* The Go chart's urlSecret ({name, key}): transportConfig.urlSecret, or else the one inside
transportConfig.config; an empty dict when neither names a Secret. */}}
{{- define "inferq.urlSecret" -}}
{{- $t := .Values.transportConfig -}}
{{- $s := $t.urlSecret | default dict -}}
{{- if not $s.name }}{{ $s = (($t.config | default dict).urlSecret | default dict) }}{{ end -}}
{{- if $s.name }}
{{- if not $s.key }}{{ fail "transportConfig.urlSecret.key: name the key of the Secret that holds the Redis URL" }}{{ end -}}
{{- toJson $s -}}
{{- end }}
{{- end }}

{{/* The Secret and key REDIS_URL is read from: the urlSecret, redis.existingSecret, or the Secret
made from redis.url; empty when none is set. */}}
{{- define "inferq.redisSecretName" -}}
{{- $urlSecret := include "inferq.urlSecret" . -}}
{{- if $urlSecret }}
{{- (fromJson $urlSecret).name }}
{{- else if .Values.redis.existingSecret }}
{{- .Values.redis.existingSecret }}
{{- else if .Values.redis.url }}
{{- include "inferq.componentName" (dict "root" . "suffix" "redis") }}
{{- end }}
{{- end }}

{{- define "inferq.redisSecretKey" -}}
{{- $urlSecret := include "inferq.urlSecret" . -}}
{{- if $urlSecret }}{{ (fromJson $urlSecret).key }}
{{- else if .Values.redis.existingSecret }}{{ .Values.redis.existingSecretKey }}{{ else }}redis-url{{ end }}
{{- end }}

{{/* Whether the chart writes a ConfigMap: an inline transport config, or any optional file. */}}
{{- define "inferq.hasConfigMap" -}}
{{- if or (not .Values.transportConfig.existingSecret) .Values.processor.poolConfig .Values.processor.mergePolicyConfig .Values.processor.transformConfig (and .Values.batchApi.enabled .Values.batchApi.brokerConfig) }}true{{ end }}
{{- end }}

{{- define "inferq.configMapName" -}}
{{- include "inferq.componentName" (dict "root" . "suffix" "config") }}
{{- end }}

{{/*
The projected volume mounted at /etc/inferq: transport.json (from the ConfigMap or the existing
Secret), the optional pool, merge-policy and transform files, and, for the Batch API
(dict "root" $ "apiKeys" true), api-keys.json. A projected volume, unlike a subPath mount, sees
a changed ConfigMap, which the queues reload needs.
*/}}
{{- define "inferq.configVolume" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
- name: config
  projected:
    defaultMode: 0440
    sources:
      {{- if $v.transportConfig.existingSecret }}
      - secret:
          name: {{ $v.transportConfig.existingSecret }}
          items:
            - key: {{ $v.transportConfig.existingSecretKey }}
              path: transport.json
      {{- end }}
      {{- if include "inferq.hasConfigMap" $root }}
      - configMap:
          name: {{ include "inferq.configMapName" $root }}
      {{- end }}
      {{- if .apiKeys }}
      - secret:
          name: {{ include "inferq.apiKeysSecretName" $root }}
          items:
            - key: {{ include "inferq.apiKeysSecretKey" $root }}
              path: api-keys.json
      {{- end }}
{{- end }}

{{/* The REDIS_URL variable, when a Secret gives it. */}}
{{- define "inferq.redisEnv" -}}
{{- if include "inferq.redisSecretName" . }}
- name: REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "inferq.redisSecretName" . }}
      key: {{ include "inferq.redisSecretKey" . }}
{{- end }}
{{- end }}

{{- define "inferq.apiKeysSecretName" -}}
{{- if .Values.batchApi.apiKeys.existingSecret }}
{{- .Values.batchApi.apiKeys.existingSecret }}
{{- else if .Values.batchApi.apiKeys.keys }}
{{- include "inferq.componentName" (dict "root" . "suffix" "api-keys") }}
{{- end }}
{{- end }}

{{- define "inferq.apiKeysSecretKey" -}}
{{- if .Values.batchApi.apiKeys.existingSecret }}{{ .Values.batchApi.apiKeys.existingSecretKey }}{{ else }}api-keys.json{{ end }}
{{- end }}

{{/*
A Go duration ("2m", "1m30s", "500ms", "0") as seconds, a decimal number: dict "value" "2m"
"field" "processor.drainTimeout". Anything else fails, naming the field.
*/}}
{{- define "inferq.durationSeconds" -}}
{{- $text := toString .value | trim -}}
{{- $unit := "(ns|us|µs|ms|s|m|h)" -}}
{{- $number := "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)" -}}
{{- if eq $text "0" -}}
0
{{- else if not (regexMatch (printf "^(%s%s)+$" $number $unit) $text) -}}
{{- fail (printf "%s: %q is not a Go duration such as 2m, 1m30s or 90s" .field $text) -}}
{{- else -}}
{{- $factors := dict "h" 3600.0 "m" 60.0 "s" 1.0 "ms" 0.001 "us" 0.000001 "µs" 0.000001 "ns" 0.000000001 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll (printf "%s%s" $number $unit) $text -1 -}}
{{- $digits := regexFind (printf "^%s" $number) . -}}
{{- $suffix := trimPrefix $digits . -}}
{{- $total = addf $total (mulf (float64 $digits) (get $factors $suffix)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}
{{- end }}

{{/*
The processor's terminationGracePeriodSeconds: the value given, which must be above
drainTimeout, or drainTimeout + 10 s.
*/}}
{{- define "inferq.processorGracePeriod" -}}
{{- $p := .Values.processor -}}
{{- $drain := include "inferq.durationSeconds" (dict "value" $p.drainTimeout "field" "processor.drainTimeout") | float64 -}}
{{- $given := $p.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $given -}}
{{- add (ceil $drain | int) 10 -}}
{{- else if le (float64 $given) $drain -}}
{{- fail (printf "processor.terminationGracePeriodSeconds (%v) must be above processor.drainTimeout (%s = %vs): Kubernetes would kill the pod while it still drains, before it writes its outbox. Set it to at least %d, or leave it empty to have drainTimeout + 10s." $given $p.drainTimeout $drain (add (floor $drain | int) 1)) -}}
{{- else -}}
{{- int $given -}}
{{- end -}}
{{- end }}

{{/* Whether the Batch API keeps its files on a claim the chart makes without ReadWriteMany. */}}
{{- define "inferq.batchFilesOnRwoClaim" -}}
{{- $f := .Values.batchApi.files -}}
{{- if and (not $f.url) $f.persistence.enabled (not $f.persistence.existingClaim) (not (has "ReadWriteMany" $f.persistence.accessModes)) }}true{{ end }}
{{- end }}

{{/* The checks across values; included by the processor's Deployment, so every render runs them. */}}
{{- define "inferq.validate" -}}
{{- $v := .Values -}}
{{- if not (has $v.processor.transport (list "redis-sortedset" "redis-pubsub")) }}
{{- fail (printf "processor.transport: %q is not redis-sortedset or redis-pubsub" $v.processor.transport) }}
{{- end }}
{{- if and (not $v.transportConfig.existingSecret) (not (include "inferq.redisSecretName" .)) (not $v.transportConfig.config.url) }}
{{- fail "no Redis URL: set redis.url, redis.existingSecret, transportConfig.urlSecret, or url in transportConfig.config" }}
{{- end }}
{{- if and (not $v.transportConfig.existingSecret) (not $v.transportConfig.config.queues) }}
{{- fail "transportConfig.config.queues: at least one queue is needed (docs/src/configuration.md#the-transport-config)" }}
{{- end }}
{{- if eq (include "inferq.durationSeconds" (dict "value" $v.processor.requestTimeout "field" "processor.requestTimeout") | float64) 0.0 }}
{{- fail "processor.requestTimeout: must be above 0" }}
{{- end }}
{{- $_ := include "inferq.durationSeconds" (dict "value" $v.processor.metricsBacklogPollInterval "field" "processor.metricsBacklogPollInterval") }}
{{- $_ := include "inferq.durationSeconds" (dict "value" $v.transportConfig.watchInterval "field" "transportConfig.watchInterval") }}
{{- if eq $v.processor.healthPort $v.processor.metricsPort }}
{{- fail "processor.healthPort and processor.metricsPort must differ" }}
{{- end }}
{{- if $v.batchApi.enabled }}
{{- $b := $v.batchApi }}
{{- if ne $v.processor.transport "redis-sortedset" }}
{{- fail "batchApi.enabled: the Batch API reads the transport config as redis-sortedset; it cannot run beside processor.transport=redis-pubsub" }}
{{- end }}
{{- if and (not (include "inferq.apiKeysSecretName" .)) (not $b.insecureNoAuth) }}
{{- fail "batchApi: give API keys (batchApi.apiKeys.keys or batchApi.apiKeys.existingSecret), or set batchApi.insecureNoAuth=true to let anyone who reaches the Service read every batch" }}
{{- end }}
{{- if and (include "inferq.apiKeysSecretName" .) $b.insecureNoAuth }}
{{- fail "batchApi: insecureNoAuth=true and API keys together; drop one" }}
{{- end }}
{{- if and $b.files.url (not (hasPrefix "s3://" $b.files.url)) }}
{{- fail (printf "batchApi.files.url: %q is not s3://bucket[/prefix]" $b.files.url) }}
{{- end }}
{{- if and (not $b.files.url) (not $b.files.dir) }}
{{- fail "batchApi.files: give url (s3://...) or dir" }}
{{- end }}
{{- if and (not $b.files.url) (not $b.files.persistence.enabled) (gt (int $b.replicaCount) 1) }}
{{- fail "batchApi: every replica must see the same files, and an emptyDir is one pod's own: enable batchApi.files.persistence (ReadWriteMany) or use batchApi.files.url" }}
{{- end }}
{{- if and (include "inferq.batchFilesOnRwoClaim" .) (gt (int $b.replicaCount) 1) }}
{{- fail "batchApi: more than one replica needs the files on a ReadWriteMany claim: add ReadWriteMany to batchApi.files.persistence.accessModes, name an existingClaim that allows it, or use batchApi.files.url" }}
{{- end }}
{{- with $b.lease }}
{{- $_ := include "inferq.durationSeconds" (dict "value" . "field" "batchApi.lease") }}
{{- end }}
{{- with $b.cancelGrace }}
{{- $_ := include "inferq.durationSeconds" (dict "value" . "field" "batchApi.cancelGrace") }}
{{- end }}
{{- range $b.allowCompletionWindows }}
{{- $_ := include "inferq.durationSeconds" (dict "value" . "field" "batchApi.allowCompletionWindows") }}
{{- end }}
{{- end }}
{{- end }}

{{/* The pod's /tmp: an emptyDir, since the root file system is read-only. */}}
{{- define "inferq.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end }}

{{/* The Batch API's environment: REDIS_URL, the S3 settings when files.url is set, extraEnv. */}}
{{- define "inferq.batchApiEnv" -}}
{{- $b := .Values.batchApi -}}
{{- include "inferq.redisEnv" . }}
{{- if $b.files.url }}
{{- with $b.files.s3 }}
{{- if .existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .secretAccessKeyKey }}
{{- end }}
{{- with .region }}
- name: AWS_REGION
  value: {{ . | quote }}
{{- end }}
{{- with .endpoint }}
- name: AWS_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- if .allowHttp }}
- name: AWS_ALLOW_HTTP
  value: "true"
{{- end }}
{{- end }}
{{- end }}
{{- with $b.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}
