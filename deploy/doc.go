// Package deploy holds no code: it is the home of kvgate's deployment files
// and of the test that keeps them true to the code.
//
//   - container/: the image (Dockerfile, build.sh): static kvgate, kvctl and
//     enginesim on distroless.
//   - kubernetes/base: the DaemonSet (host network, BPF capabilities, hostPath
//     mounts for bpffs, the cgroup v2 root, tokenizers and state), its
//     metrics-proxy and rules-sync sidecars and the rules ConfigMap;
//     kubernetes/userspace: the non-root overlay without BPF;
//     kubernetes/examples: a one-shot rule Job and vLLM engines; a PodMonitor.
//   - grafana/kvgate.json: the dashboard; prometheus/alerts.yaml: alert rules
//     for the silent failures of the spec (parity, ingest, fallthrough).
//
// deploy_test.go checks that every metric and label the dashboard and the
// alerts query exists in pkg/metrics, that every YAML file parses, that the
// DaemonSet's environment is documented in docs/configuration.md and parses
// with pkg/config, that its flags exist in cmd/kvgate, and that the example
// rule validates and agrees with the example vLLM flags (the parity triad).
// docs/deploy.md is the operator's guide.
package deploy
