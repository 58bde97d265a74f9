{{/* Names: the release's prefix, and one name per component. */}}
{{- define "chatqna.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The fullname's length limit: a StatefulSet's name may have at most 52 characters (its
pods' controller-revision-hash label, the name and a hash of up to 11 characters, must fit
in 63), so 52 less the longest StatefulSet suffix ("-tei-embedding"). */}}
{{- define "chatqna.fullnameLimit" -}}
{{- $longest := 0 -}}
{{- range list "tei-embedding" "tei-reranking" "vllm" "redis" -}}
{{- $longest = max $longest (len (printf "-%s" .)) -}}
{{- end -}}
{{- sub 52 $longest -}}
{{- end -}}

{{- define "chatqna.fullname" -}}
{{- $limit := int (include "chatqna.fullnameLimit" .) -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc $limit | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc $limit | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc $limit | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "chatqna.component" (list $ "backend") -> <fullname>-backend */}}
{{- define "chatqna.component" -}}
{{- printf "%s-%s" (include "chatqna.fullname" (index . 0)) (index . 1) -}}
{{- end -}}

{{- define "chatqna.labels" -}}
{{- $ := index . 0 -}}
helm.sh/chart: {{ printf "%s-%s" $.Chart.Name $.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ $.Release.Service }}
app.kubernetes.io/version: {{ $.Chart.AppVersion | quote }}
{{ include "chatqna.selectorLabels" . }}
{{- end -}}

{{- define "chatqna.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "chatqna.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "chatqna.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The pod security context: the chart-wide one, overlaid with the component's. */}}
{{- define "chatqna.podSecurityContext" -}}
{{- $ := index . 0 -}}
{{- toYaml (mergeOverwrite (deepCopy $.Values.podSecurityContext) (deepCopy (index . 1))) -}}
{{- end -}}

{{/* Endpoints, from the components or their external URLs ("" = the embedded default). */}}
{{- define "chatqna.embeddingUrl" -}}
{{- if .Values.tei.embedding.enabled -}}
{{- printf "http://%s:80" (include "chatqna.component" (list . "tei-embedding")) -}}
{{- else -}}
{{- .Values.tei.embedding.externalUrl -}}
{{- end -}}
{{- end -}}

{{- define "chatqna.rerankingUrl" -}}
{{- if .Values.tei.reranking.enabled -}}
{{- printf "http://%s:80" (include "chatqna.component" (list . "tei-reranking")) -}}
{{- else -}}
{{- .Values.tei.reranking.externalUrl -}}
{{- end -}}
{{- end -}}

{{- define "chatqna.llmUrl" -}}
{{- if .Values.vllm.enabled -}}
{{- printf "http://%s:80/v1" (include "chatqna.component" (list . "vllm")) -}}
{{- else -}}
{{- .Values.vllm.externalUrl -}}
{{- end -}}
{{- end -}}

{{- define "chatqna.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s:%d" (include "chatqna.component" (list . "redis")) (int .Values.redis.port) -}}
{{- else -}}
{{- .Values.redis.externalUrl -}}
{{- end -}}
{{- end -}}

{{- define "chatqna.otlpUrl" -}}
{{- if .Values.victoriatraces.enabled -}}
{{- printf "http://%s:%d/insert/opentelemetry" (include "chatqna.component" (list . "victoriatraces")) (int .Values.victoriatraces.port) -}}
{{- else -}}
{{- .Values.victoriatraces.externalUrl -}}
{{- end -}}
{{- end -}}

{{/* NO_PROXY of the ChatQnA containers unless config.NO_PROXY is given: loopback, the
release's Services a ChatQnA container calls, and every in-cluster name (.svc,
.cluster.local), so that a proxy set in config (HTTP_PROXY, HTTPS_PROXY) carries the calls
to the outside world only, as the compose stack's default NO_PROXY does. */}}
{{- define "chatqna.noProxy" -}}
{{- $hosts := list "localhost" "127.0.0.1" -}}
{{- $components := list
  (list "tei-embedding" .Values.tei.embedding.enabled)
  (list "tei-reranking" .Values.tei.reranking.enabled)
  (list "vllm" .Values.vllm.enabled)
  (list "redis" .Values.redis.enabled)
  (list "retriever" .Values.retriever.enabled)
  (list "victoriatraces" .Values.victoriatraces.enabled) -}}
{{- range $components -}}
{{- if index . 1 -}}
{{- $hosts = append $hosts (include "chatqna.component" (list $ (index . 0))) -}}
{{- end -}}
{{- end -}}
{{- join "," (concat $hosts (list ".svc" ".cluster.local")) -}}
{{- end -}}

{{/* Does the index live in Redis (in the chart, at a URL, or at a URL in a Secret)? */}}
{{- define "chatqna.hasRedis" -}}
{{- if or .Values.redis.enabled .Values.redis.externalUrl .Values.redis.urlSecret.name -}}true{{- end -}}
{{- end -}}

{{/* The Secret holding CHATQNA_API_KEY, OPENAI_API_KEY and HF_TOKEN, if any. */}}
{{- define "chatqna.secretName" -}}
{{- if .Values.secrets.existingSecret -}}
{{- .Values.secrets.existingSecret -}}
{{- else if or .Values.secrets.apiKey .Values.secrets.openaiApiKey .Values.secrets.hfToken -}}
{{- include "chatqna.component" (list . "secrets") -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding CHATQNA_API_KEY, if any: secrets.existingSecret (unless
secrets.existingSecretHasApiKey is false: the chart cannot look inside it), or the chart's
own when secrets.apiKey is given. */}}
{{- define "chatqna.apiKeySecret" -}}
{{- if .Values.secrets.existingSecret -}}
{{- if .Values.secrets.existingSecretHasApiKey -}}
{{- .Values.secrets.existingSecret -}}
{{- end -}}
{{- else if .Values.secrets.apiKey -}}
{{- include "chatqna.component" (list . "secrets") -}}
{{- end -}}
{{- end -}}

{{/* One env entry from the Secret, optional: a key the Secret lacks is simply unset. */}}
{{- define "chatqna.secretEnv" -}}
{{- $ := index . 0 -}}
{{- $name := include "chatqna.secretName" $ -}}
{{- if $name }}
  - name: {{ index . 1 }}
    valueFrom:
      secretKeyRef:
        name: {{ $name }}
        key: {{ index . 1 }}
        optional: true
{{- end -}}
{{- end -}}

{{/* Environment shared by the ChatQnA containers: the settings ConfigMap and the Secret. */}}
{{- define "chatqna.settingsEnv" -}}
envFrom:
  - configMapRef:
      name: {{ include "chatqna.component" (list . "settings") }}
env:
{{- include "chatqna.secretEnv" (list . "CHATQNA_API_KEY") }}
{{- include "chatqna.secretEnv" (list . "OPENAI_API_KEY") }}
{{- if .Values.redis.urlSecret.name }}
  - name: REDIS_URL
    valueFrom:
      secretKeyRef:
        name: {{ .Values.redis.urlSecret.name }}
        key: {{ .Values.redis.urlSecret.key }}
{{- end }}
{{- end -}}

{{/* HTTP probes of a ChatQnA role: liveness on /v1/health_check, readiness on /v1/ready. */}}
{{- define "chatqna.probes" -}}
startupProbe:
  httpGet: {path: /v1/health_check, port: http}
  periodSeconds: 5
  failureThreshold: 60
livenessProbe:
  httpGet: {path: /v1/health_check, port: http}
  periodSeconds: 15
  timeoutSeconds: 5
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /v1/ready, port: http}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- end -}}

{{/* How a ChatQnA pod stops. preStop sleeps (Kubernetes' own sleep action) while the
endpoints drop the pod, so requests routed to it meanwhile are still served; then SIGTERM
starts the server's graceful shutdown (uvicorn's timeout_graceful_shutdown, 5 s, in
chatqna/cli.py) and the flush of queued spans (SHUTDOWN_TIMEOUT_SECONDS, 5 s, in
chatqna/telemetry/tracing.py). The grace period covers all three with 5 s to spare.
"chatqna.terminationGrace" and "chatqna.preStop" take the role's values. */}}
{{- define "chatqna.terminationGrace" -}}
terminationGracePeriodSeconds: {{ add (int .preStopSleepSeconds) 5 5 5 }}
{{- end -}}

{{- define "chatqna.preStop" -}}
{{- with .preStopSleepSeconds -}}
lifecycle:
  preStop:
    sleep:
      seconds: {{ int . }}
{{- end }}
{{- end -}}

{{/* An init container of a ChatQnA pod: waits for the model servers and Redis the release
itself runs (TEI's /health, Redis's PING), up to 20 minutes, before the role starts and
checks them. Without it a first install crash-loops the pods while TEI downloads its model,
and the back-off then delays their start by up to 5 minutes more. External endpoints are not
waited for. Any failed attempt (refused, a timeout, an answer in another protocol) is
retried until the deadline, so an odd answer does not crash-loop the init container.
Arguments: the root context, whether the role uses reranking, its resources. */}}
{{- define "chatqna.waitForUpstreams" -}}
{{- $ := index . 0 -}}
{{- $targets := list -}}
{{- if $.Values.tei.embedding.enabled -}}
{{- $targets = append $targets (printf "%s/health" (include "chatqna.embeddingUrl" $)) -}}
{{- end -}}
{{- if and (index . 1) $.Values.tei.reranking.enabled -}}
{{- $targets = append $targets (printf "%s/health" (include "chatqna.rerankingUrl" $)) -}}
{{- end -}}
{{- if $.Values.redis.enabled -}}
{{- $targets = append $targets (include "chatqna.redisUrl" $) -}}
{{- end -}}
{{- if $targets }}
initContainers:
  - name: wait-for-upstreams
    image: {{ include "chatqna.image" $ }}
    imagePullPolicy: {{ $.Values.image.pullPolicy }}
    command:
      - python
      - -c
      - |
        import sys, time, urllib.request
        import redis
        deadline = time.monotonic() + 1200
        def attempt(target):
            """None once the target answers, else what it did instead."""
            try:
                if target.startswith(("redis://", "rediss://", "unix://")):
                    with redis.Redis.from_url(target, socket_timeout=5) as client:
                        return None if client.ping() else "no PONG"
                with urllib.request.urlopen(target, timeout=5) as response:
                    return None if response.status == 200 else f"HTTP {response.status}"
            except Exception as error:  # whatever it answered, or not: try again
                return f"{type(error).__name__}: {error}"
        for target in sys.argv[1:]:
            while (problem := attempt(target)) is not None:
                if time.monotonic() > deadline:
                    sys.exit(f"{target} is still not up after 20 minutes ({problem})")
                print(f"waiting for {target} ({problem})", flush=True)
                time.sleep(5)
    args:
      {{- range $targets }}
      - {{ . | quote }}
      {{- end }}
    resources:
      {{- toYaml (index . 2) | nindent 6 }}
    securityContext:
      {{- toYaml $.Values.securityContext | nindent 6 }}
{{- end }}
{{- end -}}

{{/* A volume: a PVC of the given name when persistence is on, else an emptyDir. */}}
{{- define "chatqna.dataVolume" -}}
{{- $ := index . 0 -}}
{{- $persistence := index . 2 -}}
- name: data
{{- if $persistence.enabled }}
  persistentVolumeClaim:
    claimName: {{ index . 1 }}
{{- else }}
  emptyDir: {}
{{- end -}}
{{- end -}}

{{/* A PersistentVolumeClaim, when persistence is on. */}}
{{- define "chatqna.pvc" -}}
{{- $ := index . 0 -}}
{{- $persistence := index . 3 -}}
{{- if $persistence.enabled }}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {{ index . 1 }}
  labels:
    {{- include "chatqna.labels" (list $ (index . 2)) | nindent 4 }}
spec:
  accessModes: [ReadWriteOnce]
  {{- with $persistence.storageClass }}
  storageClassName: {{ . }}
  {{- end }}
  resources:
    requests:
      storage: {{ $persistence.size }}
{{- end -}}
{{- end -}}
