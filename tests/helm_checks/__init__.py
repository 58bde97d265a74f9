"""Checks of the Helm chart (deploy/helm/chatqna): rendered offline, validated, cross-checked.

`render()` runs `helm template` with the helm binary `scripts/k8s-tools` installs (cached in
.cache/k8s-tools); every other check is a function that takes parsed manifests or chart files
and returns a list of `Problem`s, so the tests run it on the chart and on copies with a
planted mistake. No cluster and no network after the first install. From the repository
root, `.venv/bin/python -m tests.helm_checks` prints the chart's problems.

The checks live in modules named for what they look at: `helm` (render, lint), `schema`,
`manifests` (walking rendered objects), `containers`, `wiring`, `monitoring`, `lifecycle`,
`names`, `chart_files`, and `everything` (all of them, on the chart); this package exports
their public names.

What is checked, for each values file the chart ships (the defaults, values-*.yaml):

- `helm lint --strict` passes and every rendered manifest validates, with unknown fields
  rejected, against the Kubernetes OpenAPI schemas of `KUBERNETES_VERSION`
  (kubernetes-validate, a pinned test dependency that carries them), and against those of
  the oldest version the chart admits (`kubeVersion` in Chart.yaml).
- ChatQnA containers (the chatqna image): liveness on /v1/health_check and readiness on
  /v1/ready, on a port the container declares and the role's port setting says; every
  environment variable and settings ConfigMap key is a setting of chatqna/settings.py;
  secrets (the API key, upstream tokens) come from a Secret, never a literal or a ConfigMap;
  every in-cluster URL they are given names a rendered Service and one of its ports, and
  (with the values files' own NO_PROXY) NO_PROXY and no_proxy name each such Service.
- ChatQnA pods wait in an init container (the ChatQnA image) for the model servers and Redis
  of the release their role uses, and for nothing else (not for external endpoints); its
  script compiles, and each attempt catches any exception (an answer in another protocol
  raises http.client's errors or ValueError, not OSError), so the wait never crashes.
- Every container has probes (init containers aside), CPU and memory requests, a memory
  limit, and cannot escalate privileges; every pod runs as non-root without a Kubernetes
  API token. Services and disruption budgets select pods of the release, and
  ConfigMaps and Secrets referenced by pods are rendered (or named as external).
- With an API key, the metrics scraper's jobs send it (`authorization.credentials_file`, a
  file mounted from the key's Secret); without one, they send no credentials. A Secret the
  chart does not render (`secrets.existingSecret`) holds the key unless the caller names
  it as keyless (`secrets.existingSecretHasApiKey=false`).
- With a metrics scraper, every pod of each ChatQnA workload is a scrape target (a job
  resolving a headless Service that selects it, on its role's port).
- ChatQnA containers sleep in preStop (Kubernetes' sleep action) and the pod's grace period
  exceeds that sleep plus uvicorn's graceful shutdown (chatqna/cli.py) and the tracing's
  shutdown bound (chatqna/telemetry/tracing.py).
- Grafana's dashboards are deploy/grafana's, byte for byte, and its datasources are
  deploy/grafana's except for the URLs.
- Names: StatefulSets within 52 characters (their revision-hash label must fit in 63),
  Services and label values within 63, also with a release name of Helm's maximum 53.
- Chart files: values.yaml's `config` keys are settings, with .env.example's defaults;
  every top-level key of values.yaml is in the chart README's values table and every key
  in that table exists.
"""

from tests.deploy_checks import PROXY_BYPASS, Problem, container_variables
from tests.helm_checks.chart_files import (
    chart_file_problems,
    config_problems,
    documented_keys,
    values_doc_problems,
)
from tests.helm_checks.containers import (
    CHATQNA_LIVENESS,
    CHATQNA_READINESS,
    SECRET_SETTINGS,
    probe_problems,
    security_problems,
    settings_problems,
)
from tests.helm_checks.everything import chart_problems, manifest_problems
from tests.helm_checks.helm import (
    CHART,
    KUBERNETES_VERSION,
    NAMESPACE,
    OLDEST_KUBERNETES_VERSION,
    RELEASE,
    REPO,
    VALUES_FILES,
    RenderError,
    helm_binary,
    lint_problems,
    parse_manifests,
    render,
    render_text,
)
from tests.helm_checks.lifecycle import (
    DEFAULT_GRACE_SECONDS,
    WAIT_CONTAINER,
    WAITED_FOR,
    shutdown_bound_seconds,
    startup_wait_problems,
    termination_problems,
    wait_script,
    wait_script_problems,
)
from tests.helm_checks.manifests import (
    CHATQNA_IMAGE,
    Manifest,
    by_kind,
    container_ports,
    containers,
    environment,
    is_chatqna,
    name_of,
    pod_spec,
    probe_target,
    role_port,
    settings_configmap_keys,
    workloads,
)
from tests.helm_checks.monitoring import (
    api_key_secrets,
    grafana_problems,
    scrape_auth_problems,
    scrape_config,
    scrape_coverage_problems,
    secret_file,
)
from tests.helm_checks.names import (
    LABEL_LIMIT,
    LONGEST_RELEASE,
    STATEFULSET_NAME_LIMIT,
    name_length_problems,
)
from tests.helm_checks.schema import schema_problems
from tests.helm_checks.wiring import proxy_problems, reference_problems, url_problems

__all__ = [
    "CHART",
    "CHATQNA_IMAGE",
    "CHATQNA_LIVENESS",
    "CHATQNA_READINESS",
    "DEFAULT_GRACE_SECONDS",
    "KUBERNETES_VERSION",
    "LABEL_LIMIT",
    "LONGEST_RELEASE",
    "NAMESPACE",
    "OLDEST_KUBERNETES_VERSION",
    "PROXY_BYPASS",
    "RELEASE",
    "REPO",
    "SECRET_SETTINGS",
    "STATEFULSET_NAME_LIMIT",
    "VALUES_FILES",
    "WAITED_FOR",
    "WAIT_CONTAINER",
    "Manifest",
    "Problem",
    "RenderError",
    "api_key_secrets",
    "by_kind",
    "chart_file_problems",
    "chart_problems",
    "config_problems",
    "container_ports",
    "container_variables",
    "containers",
    "documented_keys",
    "environment",
    "grafana_problems",
    "helm_binary",
    "is_chatqna",
    "lint_problems",
    "manifest_problems",
    "name_length_problems",
    "name_of",
    "parse_manifests",
    "pod_spec",
    "probe_problems",
    "probe_target",
    "proxy_problems",
    "reference_problems",
    "render",
    "render_text",
    "role_port",
    "schema_problems",
    "scrape_auth_problems",
    "scrape_config",
    "scrape_coverage_problems",
    "secret_file",
    "security_problems",
    "settings_configmap_keys",
    "settings_problems",
    "shutdown_bound_seconds",
    "startup_wait_problems",
    "termination_problems",
    "url_problems",
    "values_doc_problems",
    "wait_script",
    "wait_script_problems",
    "workloads",
]
