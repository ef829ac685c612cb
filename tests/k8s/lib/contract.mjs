// The names the manifests share with the rest of gpuipc (image, socket,
// uid/gid, broker flags, seccomp profile) and what each setup must look like.
// A change here is a change of contract: the Dockerfile, the broker's flags
// and k8s/README.md must follow.

export const IMAGE = 'ghcr.io/gpuipc/gpuipc:0.1.0';
export const IMAGE_VERSION = '0.1.0';
export const BROKER_BIN = '/usr/bin/gpuipc-broker';
export const CLI = 'gpuipcctl';
// An app's command when it runs under `gpuipcctl run` (a PID no peer of the
// broker has: what cuda-legacy needs without a shared PID namespace); its
// args are then gpuipcctl's as without it.
export const RUN_COMMAND = [CLI, 'run', '--', CLI];
// GStreamer apps (the gstreamer setup): gst-launch-1.0 pipelines with gpuipcsink
// or gpuipcsrc, in the image examples/gstreamer/Dockerfile builds.
export const GST_IMAGE = 'ghcr.io/gpuipc/gpuipc-gstreamer:0.1.0';
export const GST_LAUNCH = 'gst-launch-1.0';

export const SOCKET_DIR = '/run/gpuipc';
export const SOCKET = '/run/gpuipc/gpuipc.sock';
export const SOCKET_ENV = 'GPUIPC_SOCKET';

// The image's USER, the broker's uid, and the group that owns the 0660 socket.
export const UID = 65532;
export const GID = 65532;

export const BROKER_NAME = 'gpuipc-broker';
export const BROKER_ARGS = [
  '--socket',
  SOCKET,
  '--socket-mode',
  '0660',
  '--seccomp',
  'enforce',
  '--log-format',
  'json',
];
// Flags a broker may add to BROKER_ARGS (flag -> allowed values).
export const BROKER_EXTRA_ARGS = { '--policy': ['/etc/gpuipc/policy.conf'] };
export const PROBE = [CLI, 'ping', '--timeout', '1000'];

// The Prometheus exporter next to every broker: `gpuipcctl metrics --listen`
// serving /metrics and /healthz, found by Prometheus through the pod's
// prometheus.io/* annotations or k8s/monitoring's PodMonitors.
export const METRICS_NAME = 'gpuipc-metrics';
export const METRICS_PORT = 9470;
export const METRICS_ARGS = ['metrics', '--listen', `0.0.0.0:${METRICS_PORT}`];
export const METRICS_ANNOTATIONS = {
  'prometheus.io/scrape': 'true',
  'prometheus.io/port': String(METRICS_PORT),
  'prometheus.io/path': '/metrics',
};

// Pods name the profile relative to the kubelet's seccomp root; the file
// itself is shipped as seccomp/<basename> and installed under gpuipc/.
export const LOCALHOST_PROFILE = 'gpuipc/gpuipc-broker.json';
export const PROFILE_FILE = 'gpuipc-broker.json';

// Volume types the `restricted` Pod Security profile allows.
export const RESTRICTED_VOLUMES = [
  'configMap',
  'csi',
  'downwardAPI',
  'emptyDir',
  'ephemeral',
  'persistentVolumeClaim',
  'projected',
  'secret',
];

// Kinds that have no namespace (kustomize 5.5 stamps one on some of them).
export const CLUSTER_SCOPED = [
  'Namespace',
  'DeviceClass',
  'ResourceSlice',
  'ValidatingAdmissionPolicy',
  'ValidatingAdmissionPolicyBinding',
  'MutatingAdmissionPolicy',
  'MutatingAdmissionPolicyBinding',
  'ClusterRole',
  'ClusterRoleBinding',
  'PriorityClass',
  'PersistentVolume',
  'CustomResourceDefinition',
  'SeccompProfile',
];

// Every kustomization under k8s/ that the validator renders, and what it must
// be. Keys are the setup names used in k8s/README.md and by the broken cases.
//   kind:        buffer kind the producer publishes
//   consumers:   consumers per producer
//   sharePid:    shareProcessNamespace must be true (and is forbidden otherwise)
//   runWrapped:  every app runs under `gpuipcctl run --` (RUN_COMMAND), and
//                only here; a cuda-legacy setup needs this or sharePid, as
//                two containers' first processes are both PID 1
//   deviceClass: DRA DeviceClass of the claim the apps share (null: no DRA)
//   selector:    a word the claim's CEL selector must mention
//   nodeBroker:  per-node broker (DaemonSet) on the hostPath SOCKET_DIR
//   gang:        LeaderWorkerSet scheduled by Volcano
//   onlyDiffers: rendering equals this setup's except name, kind, sharePid and
//                the apps' RUN_COMMAND
//   gstreamer:   the apps are gst-launch-1.0 pipelines (gpuipcsink, gpuipcsrc) on a ring
//   service:     the apps run until stopped (the gang); otherwise they end:
//                the producer retires after one attach per consumer and exits
//                once drained, so the pod completes and frees its GPU claim
//   weights:     node-broker's broker, a weights holder DaemonSet beside it (`gpuipcctl weights
//                serve NAME FILE... --kind <kind>`, the checkpoint on a claim mounted read-only)
//                and an engine Deployment (any image and command: the user's) in a namespace
//                that enforces restricted, which reaches the socket through a claim bound to a
//                PersistentVolume of the node's SOCKET_DIR and attaches NAME (WEIGHTS_ENV); the
//                policy lets the holder's uid publish NAME and the engines' uid attach it, and
//                not publish it
//   component:   an example of k8s/components/gpuipc-sidecar on users' own
//                workloads: its apps are any image and command (every regular
//                container is an app), the workloads of these kinds must be
//                there (`workloads`), every pod template of each gets the broker
//                exactly once, and the exporter when `exporter` is true (never
//                otherwise); `networkPolicy`: the exporter's port is open to the
//                monitoring namespace alone
export const SETUPS = {
  base: { dir: 'k8s/base', kind: 'memfd', consumers: 1, deviceClass: null },
  'dra-vmm': { dir: 'k8s/overlays/dra-vmm', kind: 'cuda-vmm', consumers: 1, deviceClass: 'gpu.nvidia.com' },
  'dra-legacy': {
    dir: 'k8s/overlays/dra-legacy',
    kind: 'cuda-legacy',
    consumers: 1,
    deviceClass: 'gpu.nvidia.com',
    sharePid: true,
    onlyDiffers: 'dra-vmm',
  },
  'legacy-pid': {
    dir: 'k8s/overlays/legacy-pid',
    kind: 'cuda-legacy',
    consumers: 1,
    deviceClass: 'gpu.nvidia.com',
    runWrapped: true,
    onlyDiffers: 'dra-vmm',
  },
  fanout: { dir: 'k8s/overlays/fanout', kind: 'cuda-vmm', consumers: 3, deviceClass: 'gpu.nvidia.com' },
  mig: {
    dir: 'k8s/overlays/mig',
    kind: 'cuda-vmm',
    consumers: 1,
    deviceClass: 'mig.nvidia.com',
    selector: 'profile',
  },
  'node-broker': {
    dir: 'k8s/overlays/node-broker',
    kind: 'cuda-vmm',
    consumers: 1,
    deviceClass: 'gpu.nvidia.com',
    nodeBroker: true,
  },
  gstreamer: { dir: 'k8s/overlays/gstreamer', kind: 'memfd', consumers: 2, deviceClass: null, gstreamer: true },
  'inference-deployment': {
    dir: 'k8s/examples/inference-deployment',
    component: true,
    workloads: ['Deployment'],
    exporter: true,
    networkPolicy: true,
    deviceClass: 'gpu.nvidia.com',
    service: true,
  },
  statefulset: {
    dir: 'k8s/examples/statefulset',
    component: true,
    workloads: ['StatefulSet'],
    exporter: false,
    deviceClass: null,
    service: true,
  },
  leaderworkerset: {
    dir: 'k8s/examples/leaderworkerset',
    component: true,
    workloads: ['LeaderWorkerSet'],
    exporter: true,
    deviceClass: 'gpu.nvidia.com',
    service: true,
  },
  'node-weights': {
    dir: 'k8s/examples/node-weights',
    kind: 'memfd',
    deviceClass: null,
    nodeBroker: true,
    weights: true,
    service: true,
  },
  gang: {
    dir: 'k8s/overlays/gang',
    kind: 'cuda-vmm',
    consumers: 1,
    deviceClass: 'gpu.nvidia.com',
    gang: true,
    service: true,
  },
};

// The opt-in labels of the sidecar components (k8s/components/gpuipc-sidecar), the label
// gpuipc-metrics puts on the pods it gives an exporter, and the only namespace that
// gpuipc-metrics-networkpolicy lets reach the exporter.
export const SIDECAR_LABEL = 'gpuipc.io/sidecar';
export const SIDECAR_LEADER_LABEL = 'gpuipc.io/sidecar-leader';
export const EXPORTER_LABEL = 'gpuipc.io/exporter';
export const MONITORING_NAMESPACE = 'monitoring';
// The uid the component's exporter runs as (the broker's is UID).
export const EXPORTER_UID = 65533;

// The node-broker overlay's PriorityClass (an evicted broker drops every
// reference on its node).
export const NODE_BROKER_PRIORITY = 'gpuipc-node-critical';

// The node-weights example: the weights' name, as the engines learn it from their environment.
export const WEIGHTS_ENV = 'GPUIPC_WEIGHTS';


// Kustomizations that prepare a cluster rather than run gpuipc, each checked by
// its own rules (lib/support.mjs):
//   node-setup:       the DaemonSet that installs the seccomp profile and the
//                     node broker's socket directory on every node
//   seccomp-operator: the same profile as a Security Profiles Operator object
//   monitoring:       Prometheus Operator PodMonitors for the exporters
//   grafana:          the dashboard as a ConfigMap for Grafana's dashboard sidecar
export const SUPPORT = {
  'node-setup': { dir: 'k8s/node-setup' },
  'seccomp-operator': { dir: 'k8s/seccomp-operator' },
  monitoring: { dir: 'k8s/monitoring' },
  grafana: { dir: 'k8s/grafana' },
};

// kube-prometheus-stack's Prometheus selects PodMonitors labelled release: <its Helm release>
// (podMonitorSelectorNilUsesHelmValues); the PodMonitors carry the chart's usual release name.
export const PODMONITOR_RELEASE = 'kube-prometheus-stack';
// The label Grafana's dashboard sidecar looks for (the Grafana chart's default), and the file.
export const GRAFANA_LABEL = ['grafana_dashboard', '1'];
export const DASHBOARD_FILE = 'k8s/grafana/gpuipc-dashboard.json';

// The Kubernetes minors k8s/README.md supports: 1.33 through k8s/components/kubernetes-1.33
// (resource.k8s.io/v1beta2, checked against 1.33's schema), later ones as rendered (v1).
export const SUPPORTED_MINORS = ['1.33', '1.34', '1.35', '1.36'];
export const SECCOMP_ROOT = '/var/lib/kubelet/seccomp';
export const IMAGE_PROFILE = `/usr/share/gpuipc/seccomp/${PROFILE_FILE}`;
